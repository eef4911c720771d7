"""GET /metrics: Prometheus series for staff or a bearer token, nobody else."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from inference import runtime
from inference.engine.core.sampling_params import SamplingParams

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def running_engine(chat_model_dir, django_db_blocker):
    # NOTE: a fresh engine, not one an earlier module left running: the counters start at zero.
    runtime.stop_engine()
    with django_db_blocker.unblock():  # the active configuration is read from the database
        runtime.start_engine(wait=True)
    engine = runtime.get_engine()
    engine.generate(["Hello"], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    yield engine
    runtime.stop_engine()


def test_anonymous_and_non_staff_users_are_refused(client) -> None:
    response = client.get("/metrics")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == 'Bearer realm="metrics"'
    get_user_model().objects.create_user("alice", password="pw-alice-123")
    client.login(username="alice", password="pw-alice-123")
    assert client.get("/metrics").status_code == 401


@pytest.mark.real_weights
def test_staff_see_the_engine_series(client, running_engine) -> None:
    get_user_model().objects.create_user("ops", password="pw-ops-12345", is_staff=True)
    client.login(username="ops", password="pw-ops-12345")
    response = client.get("/metrics")
    assert response.status_code == 200
    body = response.content.decode()
    for series in (
        "cachet_engine_requests_running",
        "cachet_engine_requests_waiting",
        "cachet_engine_kv_cache_usage_ratio",
        "cachet_engine_cached_prompt_tokens_total",
        "cachet_engine_time_to_first_token_seconds_bucket",
        "cachet_engine_inter_token_latency_seconds_bucket",
        "cachet_engine_preemptions_total",
    ):
        assert series in body, series
    assert "cachet_engine_generation_tokens_total 4.0" in body


@pytest.mark.real_weights
def test_a_bearer_token_opens_metrics_and_a_wrong_one_does_not(client, settings, running_engine):
    settings.CACHET_METRICS_TOKEN = "scrape-token-0123456789"
    ok = client.get("/metrics", headers={"Authorization": "Bearer scrape-token-0123456789"})
    assert ok.status_code == 200
    wrong = client.get("/metrics", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401


def test_without_an_engine_metrics_answer_503(client, settings) -> None:
    runtime.stop_engine()
    settings.CACHET_METRICS_TOKEN = "scrape-token-0123456789"
    response = client.get("/metrics", headers={"Authorization": "Bearer scrape-token-0123456789"})
    assert response.status_code == 503
