"""frontend.dashboard: the staff performance page, its data and the benchmark chart; staff only.

No engine runs in this process (the live server tests, test_dashboard_browser.py, sample a real
one): the data says so and still carries the last benchmark run.
"""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import User
from django.test import Client

from frontend.dashboard import BENCHMARK_TABLE
from inference import metrics_history
from inference.engine.metrics import EngineMetrics
from inference.metrics_samples import BackendReading, read_engine

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff() -> Client:
    client = Client()
    client.force_login(User.objects.create_user("carol", is_staff=True))
    return client


@pytest.fixture
def member() -> Client:
    client = Client()
    client.force_login(User.objects.create_user("alice"))
    return client


def test_an_anonymous_visitor_is_sent_to_log_in_and_gets_no_data(client) -> None:
    response = client.get("/staff/dashboard/")
    assert response.status_code == 302 and response["Location"].startswith("/login/")
    assert client.get("/staff/dashboard/data/").status_code == 401
    assert client.get("/staff/dashboard/benchmark.png").status_code == 404


def test_a_user_who_is_not_staff_sees_no_dashboard_link_and_is_refused_everything(member) -> None:
    assert b"/staff/dashboard/" not in member.get("/").content
    assert member.get("/staff/dashboard/").status_code == 403
    refused = member.get("/staff/dashboard/data/")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
    assert member.get("/staff/dashboard/benchmark.png").status_code == 404


def test_staff_get_the_link_the_page_with_its_charts_and_the_last_benchmark_run(staff) -> None:
    assert b'href="/staff/dashboard/"' in staff.get("/").content
    page = staff.get("/staff/dashboard/")
    assert page.status_code == 200
    assert page.content.count(b"<canvas") == 7
    assert b"This server process only" in page.content

    data = staff.get("/staff/dashboard/data/").json()
    # NOTE: no sampler runs in the test process; "now" depends on whether an earlier test of this
    # process started an engine, so only its shape is checked.
    assert data["process"]["is_sampling"] is False
    assert data["now"] is None or data["now"]["model"]
    recorded = json.loads(BENCHMARK_TABLE.read_text())
    assert data["benchmark"]["rows"] == recorded["rows"]

    chart = staff.get("/staff/dashboard/benchmark.png")
    assert chart.status_code == 200 and chart["Content-Type"] == "image/png"
    assert b"".join(chart.streaming_content)[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_a_recorded_benchmark_run_the_data_says_none_and_there_is_no_chart(
    staff, tmp_path, monkeypatch
) -> None:
    monkeypatch.setattr("frontend.dashboard.BENCHMARK_TABLE", tmp_path / "benchmarks.json")
    assert staff.get("/staff/dashboard/data/").json()["benchmark"] is None
    assert staff.get("/staff/dashboard/benchmark.png").status_code == 404
    (tmp_path / "benchmarks.json").write_text("{not json")
    assert staff.get("/staff/dashboard/data/").json()["benchmark"] is None


def test_the_data_carries_a_series_per_sampled_model_most_recent_first(staff, monkeypatch) -> None:
    history = metrics_history.MetricsHistory(interval_s=5.0)
    for model, engine_id in (("first-model", 1), ("second-model", 2)):
        metrics = EngineMetrics()
        for time in (0.0, 5.0, 10.0):
            metrics.record_first_token(0.2, num_prompt_tokens=10, num_cached=5)
            reading = read_engine(metrics.registry, time=time, model=model, engine_id=engine_id)
            history.add(reading, BackendReading(time))
    monkeypatch.setattr(metrics_history, "_history", history)

    data = staff.get("/staff/dashboard/data/").json()
    assert data["process"]["is_sampling"] is True
    assert [series["model"] for series in data["models"]] == ["second-model", "first-model"]
    first = data["models"][1]
    assert len(first["points"]) == 3 and first["window"]["num_requests"] == 0
    assert first["window"]["prompt_tokens"] == 30 and first["window"]["hit_rate"] == 0.5
    assert not any(series["is_current"] for series in data["models"])  # no engine runs here
