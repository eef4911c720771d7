"""Celery tasks of the evals app: an evaluation run, and starting one."""

from __future__ import annotations

import datetime
import logging
import threading

from celery import shared_task
from django.conf import settings
from django.contrib.auth.models import User
from django.db import close_old_connections, connection, transaction
from django.utils import timezone
from django.utils.translation import gettext_noop
from kombu.exceptions import OperationalError as BrokerError

from evals.evaluation import EMPTY_GOLDEN_SET, run_evaluation
from evals.models import EvalRun, GoldenQuestion

logger = logging.getLogger(__name__)

SOFT_TIME_LIMIT_S = 60 * 60
ACTIVE = (EvalRun.Status.QUEUED, EvalRun.Status.RUNNING)
STOPPED = gettext_noop(
    "The run did not finish within an hour: the worker or server running it stopped."
)
RESTARTED = gettext_noop("The server restarted while the run was in progress: run it again.")
# Without a broker, runs are threads of this process; those created before it started are over.
PROCESS_STARTED_AT = timezone.now()
# Held while a run is started (`new_run`): "evalrun".
START_LOCK_KEY = 0x6576616C_72756E
NOT_QUEUED = "Could not queue the evaluation: the task broker is unreachable (%s)."


class CannotStartRun(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@shared_task(
    name="evals.run_evaluation",
    acks_late=True,
    soft_time_limit=SOFT_TIME_LIMIT_S,
    time_limit=SOFT_TIME_LIMIT_S + 60,
)
def evaluate_golden_set(run_id: int) -> dict[str, int | str]:
    """Run evaluation `run_id` (re-fetched; a run already started is left alone)."""
    run = run_evaluation(run_id)
    return {"run_id": run.pk, "status": run.status}


def expire_stale_runs(*, in_server: bool = False) -> int:
    """Fail the runs still queued or running after the task's time limit (their worker died).

    `in_server`: called by the web server process, which, without a broker, runs every run in a
    thread of its own: then the runs created before it started were a previous process's, which
    a restart ended, and they fail at once. NOTE: only there: another process (the
    `eval_golden_set` command) cannot tell a live server's run from a dead one's.
    """
    now = timezone.now()
    cutoff = now - datetime.timedelta(seconds=SOFT_TIME_LIMIT_S + 120)
    active = EvalRun.objects.filter(status__in=ACTIVE)
    num_expired = active.filter(created_at__lt=cutoff).update(
        status=EvalRun.Status.FAILED, error=STOPPED, finished_at=now
    )
    if in_server and settings.CELERY_TASK_ALWAYS_EAGER:
        num_expired += active.filter(created_at__lt=PROCESS_STARTED_AT).update(
            status=EvalRun.Status.FAILED, error=RESTARTED, finished_at=now
        )
    return num_expired


def new_run(user: User) -> EvalRun:
    """A new queued run; CannotStartRun while another run is active or the golden set is
    empty."""
    # NOTE: the check and the insert are one step: two starts at once (two clicks, the page and
    # the command) would otherwise both find no active run and both create one. PostgreSQL
    # serialises them on an advisory lock held to the commit; SQLite's transactions are
    # IMMEDIATE (settings), which serialises them already.
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [START_LOCK_KEY])
        expire_stale_runs()
        if EvalRun.objects.filter(status__in=ACTIVE).exists():
            message = gettext_noop("An evaluation is already running.")
            raise CannotStartRun("run_in_progress", message)
        if not GoldenQuestion.objects.filter(is_active=True).exists():
            raise CannotStartRun("empty_golden_set", EMPTY_GOLDEN_SET)
        return EvalRun.objects.create(started_by=user)


def start_run(user: User) -> EvalRun:
    """A new queued run (`new_run`), started once the transaction commits."""
    run = new_run(user)
    run_id = run.pk
    transaction.on_commit(lambda: _publish(run_id))
    return run


def _publish(run_id: int) -> None:
    if settings.CELERY_TASK_ALWAYS_EAGER:
        # NOTE: without a broker, tasks run in-process; an ingestion runs inside its upload's
        # request, but a run takes minutes, so it gets a thread of its own and the page polls.
        thread = threading.Thread(
            target=_run_here, args=(run_id,), name=f"eval-run-{run_id}", daemon=True
        )
        thread.start()
        return
    try:
        evaluate_golden_set.apply_async((run_id,), ignore_result=True)
    except BrokerError as error:
        logger.warning("evaluation run %s was not queued: %s", run_id, error)
        EvalRun.objects.filter(pk=run_id).update(
            status=EvalRun.Status.FAILED, error=NOT_QUEUED % error, finished_at=timezone.now()
        )


def _run_here(run_id: int) -> None:
    try:
        run_evaluation(run_id)
    finally:
        close_old_connections()
