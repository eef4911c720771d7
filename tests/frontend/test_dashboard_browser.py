"""The staff dashboard against a real server under a short load: its numbers agree with `/metrics`
and its charts are drawn, at desktop and phone width; a user who is not staff never sees it.

The load is a few chats through the real model in the browser. The server samples every second
(CACHET_DASHBOARD_SAMPLE_S=1), so the last hour's history holds the load by the time it is read.
Screenshots go to var/test-artifacts (CACHET_TEST_ARTIFACTS).
"""

from __future__ import annotations

import json
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.live_server import LiveServer
from inference.engine.metrics import ITL_BUCKETS, TTFT_BUCKETS
from tests.frontend import test_browser
from tests.frontend.test_browser import TIMEOUT_MS, screenshot, send

# The chat's browser tests' fixtures: Chromium, and log-in on this module's `server`.
browser = test_browser.browser
log_in = test_browser.log_in

pytestmark = pytest.mark.real_weights

SETUP = """
from django.contrib.auth.models import User
from chat.models import AssistantProfile
User.objects.create_user("alice", password="alice-secret-pw")
User.objects.create_user("carol", password="carol-secret-pw", is_staff=True)
AssistantProfile.objects.create(name="Assistant", is_default=True, temperature=0, max_tokens=24)
"""
QUESTIONS = (
    "Name one colour of the sky.",
    "Name another colour.",
    "And one more colour, please.",
)
ENGINE_CHARTS = ("hit_rate", "ttft", "itl", "tokens_per_s", "requests", "kv_usage")
# The series' colours (charts.js PALETTE: p50/running, p90/waiting, p99) and the pixels below
# the legend strip, where only the lines and the grid are.
SERIES_RGB = ((59, 91, 219), (232, 89, 12), (43, 138, 62))
PLOT_TOP_CSS_PX = 30
CANVAS_PIXELS = """(canvas, [topCssPx, colours]) => {
  const ratio = canvas.width / canvas.clientWidth;
  const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
  const top = Math.round(topCssPx * ratio) * canvas.width * 4;
  let painted = 0, series = 0;
  for (let i = 0; i < data.length; i += 4) {
    if (data[i + 3] === 0) continue;
    painted++;
    const near = colours.some(([r, g, b]) => Math.abs(data[i] - r) < 40
      && Math.abs(data[i + 1] - g) < 40 && Math.abs(data[i + 2] - b) < 40);
    if (i >= top && near) series++;
  }
  return {painted, series, points: Number(canvas.dataset.points || 0)};
}"""


@pytest.fixture(scope="module")
def server(chat_model_dir):
    env = {"CACHET_DEBUG": "0", "CACHET_DASHBOARD_SAMPLE_S": "1"}
    with LiveServer(models_dir=chat_model_dir.parent, env=env) as live:
        live.shell(SETUP)
        live.start()
        yield live


@pytest.fixture(scope="module")
def loaded(server, browser):
    """Three turns of one chat through the real model (the later ones hit the prefix cache)."""
    context = browser.new_context(locale="en-US")
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.goto(f"{server.url}/login/")
    page.fill("#id_username", "alice")
    page.fill("#id_password", "alice-secret-pw")
    page.click(".login-form button[type=submit]")
    page.wait_for_selector('#connection-status[data-state="open"]', state="attached")
    assert page.locator("#model-picker").is_hidden()  # one model: nothing to pick
    for number, question in enumerate(QUESTIONS, 1):
        send(page, question)
        page.wait_for_function(
            f"() => document.querySelectorAll('.message.assistant .stats').length >= {number}"
        )
    # one model: the answers do not name it either
    assert page.locator(".message.assistant .answer-model").first.is_hidden()
    context.close()
    time.sleep(2.5)  # two more samples after the load ended


def metric_values(text: str) -> dict[tuple[str, tuple], float]:
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


def bucket_of(values: dict, name: str, bounds: tuple[float, ...], quantile: float) -> tuple:
    """The (lower, upper] bucket of `/metrics` that holds the `quantile` observation."""
    cumulative = [values[(f"{name}_bucket", (("le", str(bound)),))] for bound in bounds]
    total = values[(f"{name}_count", ())]
    lower = 0.0
    for bound, count in zip(bounds, cumulative, strict=True):
        if count >= quantile * total:
            return lower, bound
        lower = bound
    return lower, None


def test_the_dashboards_numbers_agree_with_metrics_after_a_short_load(server, loaded, log_in):
    page = log_in("carol", "carol-secret-pw")
    data = page.request.get(f"{server.url}/staff/dashboard/data/").json()
    values = metric_values(server.metrics_text())
    page.context.close()

    def metric(name: str, **labels: str) -> float:
        return values[(f"cachet_engine_{name}", tuple(sorted(labels.items())))]

    now = data["now"]
    assert now["num_requests"] >= len(QUESTIONS)
    # Counts: exactly the same as /metrics.
    assert now["prompt_tokens"] == metric("prompt_tokens_total")
    assert now["cached_prompt_tokens"] == metric("cached_prompt_tokens_total") > 0
    assert now["generation_tokens"] == metric("generation_tokens_total")
    for reason, count in now["num_requests_by_finish_reason"].items():
        assert count == metric("requests_total", finish_reason=reason)
    ttft = "cachet_engine_time_to_first_token_seconds"
    itl = "cachet_engine_inter_token_latency_seconds"
    assert now["ttft"]["count"] == values[(f"{ttft}_count", ())] == now["num_requests"]
    assert now["itl"]["count"] == values[(f"{itl}_count", ())] > 0
    assert now["hit_rate"] == pytest.approx(
        metric("cached_prompt_tokens_total") / metric("prompt_tokens_total")
    )
    # Percentiles: in the bucket of /metrics' histogram that holds them (its resolution).
    for key, name, bounds in (("ttft", ttft, TTFT_BUCKETS), ("itl", itl, ITL_BUCKETS)):
        for label, quantile in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
            estimate = now[key][label]
            lower, upper = bucket_of(values, name, bounds, quantile)
            assert (estimate["lower"], estimate["upper"]) == (lower, upper), (key, label)
            assert lower <= estimate["value"] <= (upper if upper is not None else lower)

    # The last hour's history holds the same load (the ring has dropped nothing yet).
    [series] = data["models"]
    assert series["is_current"] and series["model"] == now["model"]
    for key in ("num_requests", "prompt_tokens", "cached_prompt_tokens", "generation_tokens"):
        assert series["window"][key] == now[key], key
    assert any(point["hit_rate"] for point in series["points"])
    assert data["process"] == {**data["process"], "is_sampling": True, "sample_interval_s": 1.0}
    # Only numbers and model names: nothing of any user's chats.
    assert "colour" not in json.dumps(data).lower()


@pytest.mark.parametrize(
    "width, height, name",
    [(1280, 900, "dashboard-desktop.png"), (390, 844, "dashboard-phone.png")],
)
def test_staff_see_the_charts_drawn_and_the_optimization_table(
    server, loaded, log_in, width, height, name
):
    page = log_in("carol", "carol-secret-pw", viewport={"width": width, "height": height})
    if width > 640:
        page.click("#dashboard-link")
    else:
        page.goto(f"{server.url}/staff/dashboard/")  # the link is in the closed sidebar
    page.wait_for_url(f"{server.url}/staff/dashboard/")
    page.wait_for_function(
        "() => [...document.querySelectorAll('canvas[data-chart]')]"
        ".every((canvas) => canvas.dataset.points !== undefined)"
    )
    for chart in ENGINE_CHARTS:
        canvas = page.locator(f'canvas[data-chart="{chart}"]')
        pixels = canvas.evaluate(CANVAS_PIXELS, [PLOT_TOP_CSS_PX, SERIES_RGB])
        assert pixels["points"] > 0, chart
        assert pixels["series"] > 20, (chart, pixels)  # the line, not only the axes
        assert canvas.bounding_box()["width"] <= width
    assert "%" in page.locator('#cards .card[data-metric="hit_rate"] .card-value').inner_text()
    rows = page.locator("#benchmark-table tbody tr")
    assert rows.count() >= 7
    assert "prefix cache" in rows.nth(1).inner_text()
    page.wait_for_function(
        "() => { const img = document.getElementById('benchmark-chart');"
        " return !img.hidden && img.complete && img.naturalWidth > 0; }"
    )
    assert page.evaluate("document.documentElement.scrollWidth") <= width  # no sideways scroll
    screenshot(page, name)
    page.context.close()


def test_a_user_who_is_not_staff_has_no_link_and_is_refused_the_page_and_data(server, log_in):
    page = log_in("alice", "alice-secret-pw")
    assert page.locator("#dashboard-link").count() == 0
    response = page.goto(f"{server.url}/staff/dashboard/")
    assert response.status == 403
    assert page.locator("canvas").count() == 0
    data = page.request.get(f"{server.url}/staff/dashboard/data/")
    assert data.status == 403 and "now" not in data.json()
    page.context.close()
