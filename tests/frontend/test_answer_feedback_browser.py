"""Feedback on answers in Chromium against a real server and the real model: a thumb and a note
on an answer, kept across a reload; changed and cleared; at phone width too. Another user
cannot read or write it. Screenshots go to CACHET_TEST_ARTIFACTS (see test_browser.py)."""

from __future__ import annotations

import pytest

from harness.live_server import LiveServer
from tests.frontend import test_browser
from tests.frontend.test_browser import screenshot, send

browser = test_browser.browser
log_in = test_browser.log_in

pytestmark = pytest.mark.real_weights

DESKTOP = {"width": 1280, "height": 860}
PHONE = {"width": 390, "height": 844}
NOTE = "Right number, but it should say unused days carry over until March."


@pytest.fixture(scope="module")
def server(chat_model_dir):
    with LiveServer(models_dir=chat_model_dir.parent, env={"CACHET_DEBUG": "0"}) as live:
        live.shell(test_browser.SETUP)
        live.start()
        yield live


def ask(page, question: str):
    """Send `question`; the saved answer's bubble once its footer shows."""
    send(page, question)
    page.wait_for_selector(".message.assistant[data-message-id] .feedback-button")
    return page.locator(".message.assistant").last


def thumb(answer, rating: str):
    return answer.locator(f'.feedback-button[data-rating="{rating}"]')


def feedback_rows(server: LiveServer) -> list[str]:
    code = (
        "from chat.models import AnswerFeedback\n"
        "for f in AnswerFeedback.objects.order_by('pk'):\n"
        "    print(f.user.username, f.rating, repr(f.note))"
    )
    return [line for line in server.shell(code).strip().splitlines() if line]


def test_a_thumb_with_a_note_is_kept_across_a_reload_then_changed_and_cleared(
    server, log_in
) -> None:
    page = log_in("alice", "alice-secret-pw", viewport=DESKTOP)
    answer = ask(page, "How many days of paid holiday does an employee get?")
    up, down = thumb(answer, "up"), thumb(answer, "down")
    assert up.get_attribute("aria-label") == "Good answer"
    assert down.get_attribute("aria-label") == "Bad answer"
    assert [up.get_attribute("aria-pressed"), down.get_attribute("aria-pressed")] == ["false"] * 2
    assert not answer.locator(".feedback-note").is_visible()

    up.click()
    page.wait_for_function(
        "document.querySelector('.message.assistant .feedback-button[data-rating=up]')"
        ".getAttribute('aria-pressed') === 'true'"
    )
    note = answer.locator(".feedback-note textarea")
    note.wait_for(state="visible")
    assert answer.locator(".feedback-note label").inner_text() == "Add a note (optional)"
    assert page.evaluate("document.activeElement.tagName") == "TEXTAREA"  # focus moved to the note
    note.fill(NOTE)
    answer.locator(".feedback-save").click()
    answer.locator(".feedback-status", has_text="Note saved.").wait_for()
    screenshot(page, "feedback-rated-with-note.png")
    assert feedback_rows(server) == [f"alice up {NOTE!r}"]

    page.reload()
    answer = page.locator(".message.assistant[data-message-id]").last
    answer.locator(".feedback-button").first.wait_for()
    assert thumb(answer, "up").get_attribute("aria-pressed") == "true"
    assert thumb(answer, "down").get_attribute("aria-pressed") == "false"
    assert answer.locator(".feedback-note textarea").input_value() == NOTE

    thumb(answer, "down").click()  # a change keeps the note
    answer.locator('.feedback[data-rating="down"]').wait_for(state="attached")
    assert thumb(answer, "up").get_attribute("aria-pressed") == "false"
    assert feedback_rows(server) == [f"alice down {NOTE!r}"]

    thumb(answer, "down").click()  # pressing the pressed thumb clears the rating
    answer.locator('.feedback[data-rating=""]').wait_for(state="attached")
    answer.locator(".feedback-status", has_text="Rating cleared.").wait_for()
    assert not answer.locator(".feedback-note").is_visible()
    assert feedback_rows(server) == []
    page.reload()
    answer = page.locator(".message.assistant[data-message-id]").last
    answer.locator(".feedback-button").first.wait_for()
    assert thumb(answer, "down").get_attribute("aria-pressed") == "false"
    page.context.close()


def test_at_phone_width_the_thumbs_and_note_fit_and_another_user_cannot_touch_them(
    server, log_in
) -> None:
    page = log_in("alice", "alice-secret-pw", viewport=PHONE)
    answer = ask(page, "Are trains preferred for short trips?")
    thumb(answer, "down").click()
    answer.locator(".feedback-note textarea").fill("Too vague.")
    answer.locator(".feedback-save").click()
    answer.locator(".feedback-status", has_text="Note saved.").wait_for()
    box = answer.locator(".feedback-note").bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"]
    for rating in ("up", "down"):
        button = thumb(answer, rating).bounding_box()
        assert button is not None and button["x"] + button["width"] <= PHONE["width"]
    screenshot(page, "feedback-phone.png")
    message_id = answer.get_attribute("data-message-id")
    page.context.close()

    bob = log_in("bob", "bob-secret-pw", viewport=PHONE)
    url = f"{server.url}/chat/api/messages/{message_id}/feedback/"
    assert bob.request.get(url).status == 404
    token = next(c["value"] for c in bob.context.cookies() if c["name"] == "csrftoken")
    response = bob.request.put(
        url, data={"rating": "up", "note": "bob"}, headers={"X-CSRFToken": token}
    )
    assert response.status == 404
    assert feedback_rows(server)[-1] == "alice down 'Too vague.'"
    bob.context.close()


def test_in_chinese_the_thumbs_and_the_note_have_no_english_left(server, log_in) -> None:
    page = log_in("wei", "wei-secret-pw", locale="zh-CN", viewport=DESKTOP)
    answer = ask(page, "How many days of paid holiday does an employee get?")
    assert thumb(answer, "up").get_attribute("aria-label") == "好回答"
    thumb(answer, "up").click()
    answer.locator(".feedback-note textarea").wait_for(state="visible")
    assert answer.locator(".feedback-note label").inner_text() == "添加备注（可选）"  # noqa: RUF001
    answer.locator(".feedback-status", has_text="感谢反馈。").wait_for()
    test_browser.assert_all_chinese(page)
    screenshot(page, "feedback-zh.png")
    page.reload()  # rated without a note: the thumb stays pressed, the empty note stays shut
    answer = page.locator(".message.assistant[data-message-id]").last
    answer.locator(".feedback-button").first.wait_for()
    assert thumb(answer, "up").get_attribute("aria-pressed") == "true"
    assert not answer.locator(".feedback-note").is_visible()
    page.context.close()
