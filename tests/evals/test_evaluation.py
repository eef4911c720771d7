"""evals.evaluation and evals.tasks: a run over a real small golden set, with the real bundled
model (SmolLM2) answering through the chat's answer loop and the real index searched; runs that
cannot go on end `failed` with the reason, never stuck."""

from __future__ import annotations

import datetime
import io
import json
import os
import threading
import time

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.utils import timezone

import evals.tasks
from chat.models import AssistantProfile
from evals.evaluation import EMPTY_GOLDEN_SET, answer_scores, run_evaluation
from evals.models import EvalResult, EvalRun, GoldenQuestion
from evals.tasks import ACTIVE, CannotStartRun, expire_stale_runs, new_run, start_run
from harness.celery_worker import start_worker, stop_worker
from inference import runtime
from inference.models import ModelConfig
from retrieval.evaluation import score_ranking
from retrieval.ingest import ingest
from retrieval.models import Chunk, Collection
from tests.documents import add_document

DOCUMENTS = {
    "leave.md": "# Leave\n\nEvery employee gets thirty days of paid holiday each year. Unused "
    "holiday can be carried over until the end of March.\n",
    "travel.md": "# Travel\n\nTrains are preferred over flights for trips shorter than 600 "
    "kilometres. Book through the travel desk.\n",
    "kitchen.md": "# Kitchen\n\nThe office kitchen is cleaned every Friday afternoon by the "
    "facilities team.\n",
    "parking.md": "# Parking\n\nVisitors park in the north car park; staff park underground.\n",
}


pytestmark = pytest.mark.django_db


@pytest.fixture
def staff() -> User:
    return User.objects.create_user("carol", is_staff=True)


@pytest.fixture
def office(transactional_db, retriever) -> Collection:
    collection = Collection.objects.create(name="Office")
    for name, text in DOCUMENTS.items():
        ingest(add_document(collection, name, text).pk, retriever)
    return collection


def chunk_with(text: str) -> Chunk:
    return Chunk.objects.get(text__contains=text)


@pytest.fixture
def golden_set(office) -> list[GoldenQuestion]:
    AssistantProfile.objects.create(name="Assistant", is_default=True, max_tokens=40)
    leave = GoldenQuestion.objects.create(
        question="How many days of paid holiday does an employee get each year?",
        expected_answer="thirty days",
    )
    leave.expected_chunks.add(chunk_with("thirty days"))
    leave.collections.add(office)
    travel = GoldenQuestion.objects.create(
        question="Are trains preferred over flights for short trips?",
        expected_answer="Trains are preferred over flights",
    )
    travel.expected_documents.add(chunk_with("Trains").document)  # scored by document
    kitchen = GoldenQuestion.objects.create(question="When is the office kitchen cleaned?")
    kitchen.expected_chunks.add(chunk_with("kitchen"))  # no expected answer: retrieval only
    GoldenQuestion.objects.create(question="Not asked", is_active=False)
    return [leave, travel, kitchen]


@pytest.mark.real_weights
def test_a_run_scores_the_served_search_and_the_served_models_answers(
    transactional_db, served_engine, golden_set, staff
) -> None:
    run = run_evaluation(EvalRun.objects.create(started_by=staff).pk)

    assert (run.status, run.error) == (EvalRun.Status.DONE, "")
    assert run.num_questions == 3 and run.started_at <= run.finished_at
    assert run.model == runtime.engine_status()["model"] == "smollm2-135m-instruct"
    assert run.embedding_model
    leave, travel, kitchen = EvalResult.objects.filter(run=run).order_by("pk")
    assert leave.golden == golden_set[0] and kitchen.golden == golden_set[2]

    # Retrieval: the served search finds each expected passage first in this small index.
    assert (leave.retrieval_level, travel.retrieval_level) == ("chunk", "document")
    assert leave.expected == [chunk_with("thirty days").pk]
    for result in (leave, travel, kitchen):
        assert result.retrieved[0]["is_expected"], result.retrieved
        assert (result.recall1, result.recall5, result.mrr10, result.ndcg10) == (1, 1, 1, 1)
        key = "chunk_id" if result.retrieval_level == "chunk" else "document_id"
        ranked = list(dict.fromkeys(str(hit[key]) for hit in result.retrieved))
        expected = score_ranking(ranked, {str(i) for i in result.expected})
        assert result.ndcg10 == expected["ndcg10"]

    # Answers: the model's own, scored against the expected answer; none without one.
    for result in (leave, travel):
        assert result.answer and not result.error
        assert (result.answer_f1, result.answer_contained) == answer_scores(
            result.answer, result.expected_answer
        )
    assert kitchen.answer and kitchen.answer_f1 is None and kitchen.answer_contained is None
    assert run.recall5 == 1.0
    assert run.answer_f1 == round((leave.answer_f1 + travel.answer_f1) / 2, 4)

    # A second delivery of the same task leaves the finished run alone.
    assert run_evaluation(run.pk).finished_at == run.finished_at
    assert EvalResult.objects.filter(run=run).count() == 3


def test_answer_scores_use_squad_tokens_for_english_and_characters_for_chinese() -> None:
    assert answer_scores("They get thirty days.", "thirty days") == (pytest.approx(2 / 3), 1.0)
    assert answer_scores("Ten days.", "thirty days") == (0.5, 0.0)
    f1, contained = answer_scores("每年有三十天带薪假期。", "三十天")
    assert contained == 1.0 and 0 < f1 < 1
    assert answer_scores("每年十天。", "三十天")[1] == 0.0


def test_a_run_over_an_empty_golden_set_fails_with_the_reason(staff) -> None:
    GoldenQuestion.objects.create(question="switched off", is_active=False)
    run = run_evaluation(EvalRun.objects.create(started_by=staff).pk)
    assert (run.status, run.error) == (EvalRun.Status.FAILED, EMPTY_GOLDEN_SET)
    assert run.finished_at is not None


@pytest.mark.real_weights
def test_a_run_whose_model_failed_to_load_fails_with_the_models_error(
    transactional_db, golden_set, staff, settings, tmp_path
) -> None:
    runtime.stop_engine()
    settings.MODELS_DIR = tmp_path / "models"
    try:
        broken = ModelConfig(name="broken", source=str(tmp_path / "missing.gguf"))
        runtime.reload_engine(broken, wait=True)
        run = run_evaluation(EvalRun.objects.create(started_by=staff).pk)
    finally:
        runtime.stop_engine()  # the next test that serves loads its engine again
    assert run.status == EvalRun.Status.FAILED
    assert run.error.startswith("The model could not be loaded: loading 'broken' failed")
    assert not EvalResult.objects.filter(run=run).exists()


def test_start_run_refuses_an_empty_golden_set_and_a_second_run_at_once(
    staff, django_capture_on_commit_callbacks
) -> None:
    with pytest.raises(CannotStartRun) as empty:
        start_run(staff)
    assert empty.value.code == "empty_golden_set"
    GoldenQuestion.objects.create(question="How much leave?")
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        run = start_run(staff)
    assert (run.status, run.started_by, len(callbacks)) == (EvalRun.Status.QUEUED, staff, 1)
    with pytest.raises(CannotStartRun) as busy:
        start_run(staff)
    assert busy.value.code == "run_in_progress"
    assert EvalRun.objects.count() == 1


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_two_runs_started_at_once_leave_one_active_and_refuse_the_other(staff) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("runs in the integration pass (DATABASE_URL=postgres://...)")
    GoldenQuestion.objects.create(question="How much leave?")
    second: list[EvalRun | CannotStartRun] = []

    def start_second() -> None:
        try:
            second.append(new_run(staff))
        except CannotStartRun as error:
            second.append(error)
        finally:
            connection.close()

    # The first start's run is written but not committed yet when the second start checks
    # (two clicks, two requests): the check and the insert must not interleave.
    with transaction.atomic():
        first = new_run(staff)
        thread = threading.Thread(target=start_second)
        thread.start()
        thread.join(timeout=1.0)
    thread.join(timeout=30)
    assert len(second) == 1 and isinstance(second[0], CannotStartRun)
    assert second[0].code == "run_in_progress"
    assert list(EvalRun.objects.filter(status__in=ACTIVE)) == [first]


def test_a_run_left_running_past_the_time_limit_is_failed_and_no_longer_blocks(staff) -> None:
    GoldenQuestion.objects.create(question="How much leave?")
    stuck = EvalRun.objects.create(started_by=staff, status=EvalRun.Status.RUNNING)
    EvalRun.objects.filter(pk=stuck.pk).update(
        created_at=timezone.now() - datetime.timedelta(hours=2)
    )
    fresh = EvalRun.objects.create(started_by=staff, status=EvalRun.Status.RUNNING)
    assert expire_stale_runs() == 1
    stuck.refresh_from_db()
    assert stuck.status == EvalRun.Status.FAILED and "did not finish" in stuck.error
    fresh.refresh_from_db()
    assert fresh.status == EvalRun.Status.RUNNING


def test_without_a_broker_the_server_fails_at_once_a_run_its_previous_process_started(
    staff, settings
) -> None:
    settings.CELERY_TASK_ALWAYS_EAGER = True
    GoldenQuestion.objects.create(question="How much leave?")
    before_restart = EvalRun.objects.create(started_by=staff, status=EvalRun.Status.RUNNING)
    EvalRun.objects.filter(pk=before_restart.pk).update(
        created_at=evals.tasks.PROCESS_STARTED_AT - datetime.timedelta(minutes=5)
    )
    assert expire_stale_runs() == 0  # the command's process: the run may be a live server's
    assert expire_stale_runs(in_server=True) == 1
    before_restart.refresh_from_db()
    assert before_restart.status == EvalRun.Status.FAILED
    assert "restarted" in before_restart.error
    # With a broker the run's worker may still be at it: only the time limit ends it.
    settings.CELERY_TASK_ALWAYS_EAGER = False
    queued = EvalRun.objects.create(started_by=staff, status=EvalRun.Status.QUEUED)
    EvalRun.objects.filter(pk=queued.pk).update(
        created_at=evals.tasks.PROCESS_STARTED_AT - datetime.timedelta(minutes=5)
    )
    assert expire_stale_runs(in_server=True) == 0


@pytest.mark.integration
@pytest.mark.real_weights
@pytest.mark.django_db(transaction=True)
def test_a_worker_process_runs_an_evaluation_queued_through_redis(
    chat_model_dir, tmp_path, settings
) -> None:
    if not settings.REDIS_URL:
        pytest.skip("runs in the integration pass (REDIS_URL=redis://...)")
    staff = User.objects.create_user("carol", is_staff=True)
    AssistantProfile.objects.create(name="Assistant", is_default=True, max_tokens=24)
    GoldenQuestion.objects.create(
        question="What is the capital of France?", expected_answer="Paris"
    )
    db = settings.DATABASES["default"]
    env = os.environ | {
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "CACHET_DATA_DIR": str(tmp_path),
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
        if "postgresql" in db["ENGINE"]
        else os.environ.get("DATABASE_URL", ""),
    }
    with transaction.atomic():
        run = start_run(staff)  # published to the broker on commit
    log_path = tmp_path / "worker.log"
    worker = start_worker(env, log_path)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            run.refresh_from_db()
            if run.status in (EvalRun.Status.DONE, EvalRun.Status.FAILED):
                break
            time.sleep(1)
    finally:
        stop_worker(worker)
    log = log_path.read_text(errors="replace")
    assert (run.status, run.error) == (EvalRun.Status.DONE, ""), log[-3000:]
    # the worker loaded the suite's model itself: no server runs an engine for it
    assert run.model == "smollm2-135m-instruct" and run.num_questions == 1
    [result] = EvalResult.objects.filter(run=run)
    assert result.answer and result.answer_f1 is not None
    assert "evals.run_evaluation" in log


@pytest.mark.real_weights
def test_the_command_runs_the_golden_set_here_and_prints_the_run(
    transactional_db, served_engine, golden_set
) -> None:
    User.objects.create_superuser("root")
    out = io.StringIO()
    call_command("eval_golden_set", stdout=out)
    printed = json.loads(out.getvalue())
    run = EvalRun.objects.get()
    assert printed["run"] == run.pk and printed["status"] == "done"
    assert printed["num_questions"] == 3 and printed["recall5"] == run.recall5 == 1.0
    assert printed["model"] == "smollm2-135m-instruct"


def test_the_command_fails_clearly_without_staff_or_golden_questions(staff) -> None:
    with pytest.raises(CommandError, match="no active staff user 'nobody'"):
        call_command("eval_golden_set", "--user", "nobody")
    with pytest.raises(CommandError, match="The golden set is empty"):
        call_command("eval_golden_set", "--user", "carol")
    assert not EvalRun.objects.exists()
