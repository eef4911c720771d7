"""The chat's model picker with a real second backend: a second Cachet server process
(tests/remote_cachet.py) enabled as a remote backend of the server under test.

The picker appears because two models are on offer, its choice travels in the WebSocket's
`model` field (docs/chat-protocol.md), the chosen server answers, and every answer shows the
model that gave it, again after a reload (it is stored on the message). Desktop and phone width;
screenshots under var/test-artifacts (CACHET_TEST_ARTIFACTS).
"""

from __future__ import annotations

import json

import pytest

from harness.live_server import LiveServer
from tests.frontend import test_browser
from tests.frontend.test_browser import screenshot, send
from tests.remote_cachet import remote_metric

pytestmark = pytest.mark.real_weights

# The chat's browser tests' fixtures: Chromium, and log-in on this module's `server`.
browser = test_browser.browser
log_in = test_browser.log_in

LOCAL_MODEL = "smollm2-135m-instruct"
SETUP = """
from django.contrib.auth.models import User
from backends.models import InferenceBackend
from chat.models import AssistantProfile
User.objects.create_user("alice", password="alice-secret-pw")
AssistantProfile.objects.create(name="Assistant", is_default=True, temperature=0, max_tokens=16)
InferenceBackend.objects.create(name="upstream", base_url={url!r}, api_key={key!r}, model={model!r})
"""


@pytest.fixture(scope="module")
def server(chat_model_dir, remote_cachet):
    with LiveServer(models_dir=chat_model_dir.parent, env={"CACHET_DEBUG": "0"}) as live:
        live.shell(
            SETUP.format(
                url=f"{remote_cachet.url}/v1", key=remote_cachet.key, model=remote_cachet.model
            )
        )
        live.start()
        yield live


def remote_answers(remote) -> float:
    return sum(
        remote_metric(remote, f'cachet_engine_requests_total{{finish_reason="{reason}"}}')
        for reason in ("stop", "length")
    )


def last_answer_model(page, count: int) -> str:
    page.wait_for_function(
        f"() => document.querySelectorAll('.message.assistant .answer-model').length >= {count}"
    )
    chip = page.locator(".message.assistant .answer-model").nth(count - 1)
    assert chip.is_visible()
    return chip.inner_text()


def test_the_picker_sends_the_chosen_model_and_each_answer_shows_who_answered(
    server, remote_cachet, log_in
):
    page = log_in("alice", "alice-secret-pw")
    sent: list[dict] = []
    page.on(
        "websocket",
        lambda socket: socket.on("framesent", lambda payload: sent.append(json.loads(payload))),
    )
    page.reload()  # the socket opens again, now watched
    page.wait_for_selector('#connection-status[data-state="open"]', state="attached")
    page.wait_for_selector("#model-picker", state="visible")
    values = page.locator("#model-select option").evaluate_all("(o) => o.map((x) => x.value)")
    assert values == ["auto", LOCAL_MODEL, remote_cachet.model]

    before = remote_answers(remote_cachet)
    page.select_option("#model-select", remote_cachet.model)
    send(page, "Say hello.")
    assert last_answer_model(page, 1) == remote_cachet.model
    assert remote_answers(remote_cachet) == before + 1  # the remote server answered
    assert [f.get("model") for f in sent if f["type"] == "message"] == [remote_cachet.model]

    page.select_option("#model-select", LOCAL_MODEL)
    send(page, "Say goodbye.")
    assert last_answer_model(page, 2) == LOCAL_MODEL
    assert remote_answers(remote_cachet) == before + 1
    screenshot(page, "model-picker-desktop.png")

    page.select_option("#model-select", "auto")  # the routing rules: no model field at all
    page.click(".message.assistant .regenerate-button")
    page.wait_for_function(
        "() => !document.body.classList.contains('turn-running')"
        " && document.querySelectorAll('.message.assistant .answer-model').length === 2"
    )
    assert "model" not in [f for f in sent if f["type"] == "regenerate"][-1]

    page.reload()
    page.wait_for_selector(".message.assistant .answer-model")
    shown = page.locator(".message.assistant .answer-model").evaluate_all(
        "(nodes) => nodes.map((node) => node.textContent)"
    )
    assert shown[0] == remote_cachet.model and len(shown) == 2  # stored with each answer
    page.context.close()


def test_at_phone_width_the_picker_fits_beside_the_composer(server, remote_cachet, log_in):
    page = log_in("alice", "alice-secret-pw", viewport={"width": 390, "height": 844})
    page.wait_for_selector("#model-picker", state="visible")
    box = page.locator("#model-select").bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= 390
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    screenshot(page, "model-picker-phone.png")
    page.context.close()
