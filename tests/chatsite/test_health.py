"""GET /healthz on the embedded defaults and, in the integration pass, on PostgreSQL + Redis."""

from __future__ import annotations

import pytest
from django.conf import settings

from inference import runtime

pytestmark = pytest.mark.django_db

COMPONENTS = {
    "database",
    "channel_layer",
    "broker",
    "chat_model",
    "engine",
    "embedding_model",
    "search_index",
    "lexical_store",
    "remote_backends",
}


@pytest.fixture
def running_engine(chat_model_dir):
    runtime.stop_engine()  # the default configuration's, not one an earlier module left running
    runtime.start_engine(wait=True)
    yield runtime.get_engine()
    runtime.stop_engine()


@pytest.mark.real_weights
def test_health_is_ok_when_every_component_works(client, running_engine) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    report = response.json()
    assert report["status"] == "ok"
    assert set(report["components"]) == COMPONENTS
    assert report["components"]["engine"]["detail"].startswith("'default' ready; 0 running")
    for name, component in report["components"].items():
        assert component["state"] in {"ok", "not_configured"}, (name, component)


def test_an_unprepared_chat_model_makes_health_fail_with_a_reason(client, settings, tmp_path):
    settings.MODELS_DIR = tmp_path
    response = client.get("/healthz")
    assert response.status_code == 503
    report = response.json()
    assert report["status"] == "error"
    assert report["components"]["chat_model"]["state"] == "error"
    assert "prepare_models" in report["components"]["chat_model"]["detail"]


def test_health_fails_while_the_engine_is_not_running(client) -> None:
    runtime.stop_engine()
    report = client.get("/healthz").json()
    assert report["status"] == "error"
    assert report["components"]["engine"] == {
        "state": "error",
        "detail": "RuntimeError: not_started: the engine is not running in this process",
        "seconds": report["components"]["engine"]["seconds"],
    }


def test_health_says_loading_with_503_while_the_model_loads(client, chat_model_dir) -> None:
    runtime.stop_engine()
    runtime.start_engine()
    try:
        response = client.get("/healthz")
        report = response.json()
        assert response.status_code == 503
        assert report["status"] == "loading"
        assert report["components"]["engine"]["state"] == "loading"
    finally:
        runtime.stop_engine()


def test_an_unreachable_channel_layer_makes_health_fail(client, settings) -> None:
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # NOTE: port 1 on loopback: nothing listens there, so the connection is refused.
            "CONFIG": {"hosts": ["redis://127.0.0.1:1/0"]},
        }
    }
    report = client.get("/healthz").json()
    assert report["status"] == "error"
    assert report["components"]["channel_layer"]["state"] == "error"


def test_health_only_answers_get(client) -> None:
    assert client.post("/healthz").status_code == 405


@pytest.mark.integration
@pytest.mark.real_weights
def test_health_is_ok_on_postgresql_redis_layer_and_redis_broker(client, running_engine) -> None:
    if not settings.REDIS_URL or settings.DATABASES["default"]["ENGINE"].endswith("sqlite3"):
        pytest.skip("runs in the integration pass (DATABASE_URL=postgres://..., REDIS_URL=...)")
    report = client.get("/healthz").json()
    components = report["components"]
    assert report["status"] == "ok", components
    assert components["database"]["detail"] == "postgresql reachable"
    assert components["channel_layer"]["detail"] == "RedisChannelLayer round trip ok"
    assert components["broker"]["state"] == "ok"


def test_remote_backends_are_reported_and_a_down_one_leaves_health_ok() -> None:
    from backends.models import InferenceBackend
    from chatsite.health import run_checks

    assert run_checks()["components"]["remote_backends"]["state"] == "not_configured"
    InferenceBackend.objects.create(
        name="gpu-a", base_url="http://10.0.0.5:8000/v1", model="big", health="up"
    )
    InferenceBackend.objects.create(
        name="gpu-b",
        base_url="http://10.0.0.6:8000/v1",
        model="big",
        health="down",
        health_detail="connection refused",
    )
    InferenceBackend.objects.create(
        name="off", base_url="http://10.0.0.7:8000/v1", model="big", is_enabled=False
    )
    component = run_checks()["components"]["remote_backends"]
    assert component["state"] == "ok"
    assert component["detail"] == "gpu-a (big): up; gpu-b (big): down (connection refused)"
