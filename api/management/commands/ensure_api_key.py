"""`manage.py ensure_api_key`: create (or keep) the API key given in CACHET_BOOTSTRAP_API_KEY."""

from django.core.management.base import BaseCommand, CommandError

from api.keys import ensure_bootstrap_key
from chatsite.env import ConfigError


class Command(BaseCommand):
    help = (
        "If CACHET_BOOTSTRAP_API_KEY is set, make sure an API key with that value exists, owned "
        "by CACHET_BOOTSTRAP_API_USER (default 'api', created as a staff user when missing). "
        "Prints nothing when it is unset."
    )

    def handle(self, *args, **options) -> None:
        try:
            result = ensure_bootstrap_key()
        except ConfigError as error:
            raise CommandError(f"Bad setting {error}") from None
        if result is None:
            return
        api_key, created = result
        # NOTE: the prefix only; the key itself is the operator's secret and stays out of logs.
        state = "Created" if created else "Kept"
        self.stdout.write(
            f"{state} API key {api_key.prefix}… for user {api_key.user.get_username()!r}."
        )
        if not api_key.is_active:
            self.stderr.write(
                f"Warning: API key {api_key.prefix}… was revoked in the admin and stays revoked; "
                "set a new CACHET_BOOTSTRAP_API_KEY or unset it."
            )
