"""`manage.py eval_golden_set`: one evaluation run of the golden set, here and now (cron, CI).

The same run as the evaluation page's "Run evaluation", recorded beside those (the page shows it),
but in this process: it loads the model itself when no engine runs here.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from evals.evaluation import METRICS, run_evaluation
from evals.models import EvalRun
from evals.tasks import CannotStartRun, new_run


class Command(BaseCommand):
    help = "Evaluate the golden set (retrieval and answers); prints the run as one JSON object."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--user",
            default=None,
            help="the staff user the run searches and asks as (default: the first superuser)",
        )

    def handle(self, *args: Any, user: str | None, **options: Any) -> None:
        users = get_user_model().objects.filter(is_active=True, is_staff=True)
        staff = (
            users.filter(username=user).first()
            if user
            else users.filter(is_superuser=True).order_by("pk").first()
        )
        if staff is None:
            raise CommandError(
                f"no active staff user {user!r}" if user else "no active superuser: pass --user"
            )
        try:
            run = run_evaluation(new_run(staff).pk)
        except CannotStartRun as error:
            raise CommandError(str(error)) from None
        self.stdout.write(json.dumps(summary(run), indent=2))
        if run.status != EvalRun.Status.DONE:
            raise CommandError(f"run {run.pk} failed: {run.error}")


def summary(run: EvalRun) -> dict[str, Any]:
    return {
        "run": run.pk,
        "status": run.status,
        "error": run.error,
        "model": run.model,
        "embedding_model": run.embedding_model,
        "num_questions": run.num_questions,
        **{metric: getattr(run, metric) for metric in METRICS},
    }
