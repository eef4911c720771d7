"""`manage.py ensure_admin`: create or update the first staff user from the environment."""

import os

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = (
        "If CACHET_ADMIN_PASSWORD is set, make sure a superuser named CACHET_ADMIN_USERNAME "
        "(default 'admin') exists with that password. Does nothing otherwise."
    )

    def handle(self, *args, **options) -> None:
        password = os.environ.get("CACHET_ADMIN_PASSWORD", "")
        if not password:
            self.stdout.write("CACHET_ADMIN_PASSWORD is not set; no admin user created.")
            return
        username = os.environ.get("CACHET_ADMIN_USERNAME", "").strip() or "admin"
        user, created = get_user_model().objects.get_or_create(username=username)
        user.is_staff = user.is_superuser = user.is_active = True
        user.set_password(password)
        user.save()
        self.stdout.write(f"{'Created' if created else 'Updated'} superuser {username!r}.")
