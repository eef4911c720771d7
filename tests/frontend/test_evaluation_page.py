"""frontend.evaluation: the staff evaluation page, its data, starting a run and a run's
questions; staff only (members get 403 and never see the link), CSRF on the start."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from evals.evaluation import EMPTY_GOLDEN_SET
from evals.models import EvalResult, EvalRun, GoldenQuestion

pytestmark = pytest.mark.django_db

PAGE, DATA, START = "/staff/evaluation/", "/staff/evaluation/data/", "/staff/evaluation/runs/"


def client_of(user: User, *, enforce_csrf: bool = False) -> Client:
    client = Client(enforce_csrf_checks=enforce_csrf)
    client.force_login(user)
    return client


@pytest.fixture
def carol() -> User:
    return User.objects.create_user("carol", is_staff=True)


@pytest.fixture
def alice() -> User:
    return User.objects.create_user("alice")


def finished_run(user: User) -> EvalRun:
    run = EvalRun.objects.create(
        started_by=user, status=EvalRun.Status.DONE, model="smollm2", num_questions=1, recall5=1.0
    )
    EvalResult.objects.create(
        run=run, question="How much leave?", answer="Thirty days.", recall5=1.0, answer_f1=0.5
    )
    return run


def test_an_anonymous_visitor_is_sent_to_log_in_and_gets_no_data(client) -> None:
    response = client.get(PAGE)
    assert response.status_code == 302 and response["Location"].startswith("/login/")
    assert client.get(DATA).status_code == 401
    assert client.post(START).status_code == 401
    assert not EvalRun.objects.exists()


def test_a_member_gets_403_everywhere_and_no_link(alice, carol) -> None:
    run = finished_run(carol)
    GoldenQuestion.objects.create(question="How much leave?")
    client = client_of(alice)
    assert client.get(PAGE).status_code == 403
    for response in (
        client.get(DATA),
        client.post(START),
        client.get(f"{START}{run.pk}/"),
    ):
        assert response.status_code == 403
        assert response.json()["error"]["code"] == "forbidden"
        assert "leave" not in response.content.decode()
    assert EvalRun.objects.count() == 1
    assert "evaluation-link" not in client.get("/").content.decode()
    assert 'id="evaluation-link"' in client_of(carol).get("/").content.decode()


def test_staff_see_the_page_the_runs_and_a_runs_questions(carol) -> None:
    run = finished_run(carol)
    GoldenQuestion.objects.create(question="How much leave?", expected_answer="30")
    GoldenQuestion.objects.create(question="Where is parking?")
    client = client_of(carol)
    page = client.get(PAGE).content.decode()
    assert 'id="run-button"' in page and 'id="evaluation-chart"' in page
    data = client.get(DATA).json()
    assert data["golden"] == {"active": 2, "without_answer": 1}
    [listed] = data["runs"]
    assert listed["id"] == run.pk and listed["status"] == "done"
    assert listed["metrics"]["recall5"] == 1.0 and listed["model"] == "smollm2"
    detail = client.get(f"{START}{run.pk}/").json()
    [result] = detail["results"]
    assert result["answer"] == "Thirty days." and result["metrics"]["answer_f1"] == 0.5
    assert client.get(f"{START}987654/").status_code == 404


def test_starting_a_run_queues_one_then_refuses_a_second_and_an_empty_set(
    carol, django_capture_on_commit_callbacks
) -> None:
    client = client_of(carol)
    empty = client.post(START)
    assert empty.status_code == 400
    assert empty.json()["error"] == {"code": "empty_golden_set", "message": EMPTY_GOLDEN_SET}
    GoldenQuestion.objects.create(question="How much leave?")
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = client.post(START)
    assert response.status_code == 202 and len(callbacks) == 1
    assert response.json()["run"]["status"] == "queued"
    busy = client.post(START)
    assert busy.status_code == 409 and busy.json()["error"]["code"] == "run_in_progress"
    assert EvalRun.objects.count() == 1


def test_starting_a_run_needs_the_csrf_token(carol) -> None:
    GoldenQuestion.objects.create(question="How much leave?")
    assert client_of(carol, enforce_csrf=True).post(START).status_code == 403
    assert not EvalRun.objects.exists()


def test_the_error_of_a_failed_run_is_shown_in_the_pages_language(carol) -> None:
    EvalRun.objects.create(started_by=carol, status=EvalRun.Status.FAILED, error=EMPTY_GOLDEN_SET)
    client = client_of(carol)
    assert client.get(DATA).json()["runs"][0]["error"] == EMPTY_GOLDEN_SET
    chinese = client.get(DATA, HTTP_ACCEPT_LANGUAGE="zh-hans").json()["runs"][0]
    assert chinese["error"] != EMPTY_GOLDEN_SET and "黄金集" in chinese["error"]
