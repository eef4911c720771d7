"""`manage.py check_backends`: check every enabled remote backend now and record its health.

Exits non-zero when one is down, so it can run from cron or a systemd timer as a probe.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from backends.health import check_and_record
from backends.models import InferenceBackend


class Command(BaseCommand):
    help = "Check the health of every enabled remote inference backend."

    def handle(self, *args, **options) -> None:
        num_down = 0
        for backend in InferenceBackend.objects.filter(is_enabled=True):
            result = check_and_record(backend)
            num_down += not result.is_up
            self.stdout.write(f"{backend.name}\t{result.health}\t{result.detail}")
        if num_down:
            raise CommandError(f"{num_down} backend(s) down")
