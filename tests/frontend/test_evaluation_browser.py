"""The golden set and evaluation runs in Chromium against a real server and the real model: staff
rate an answer, add it to the golden set in the admin, run an evaluation from the evaluation
page and see its row, its chart and its questions, at desktop and phone widths. A member never
sees the page, its link or the admin. Screenshots go to CACHET_TEST_ARTIFACTS (test_browser.py).

Tasks run in-process (no broker): a run gets a thread of the server process, the page polls.
"""

from __future__ import annotations

import re

import pytest

from harness.live_server import LiveServer
from tests.frontend import test_browser
from tests.frontend.test_browser import TIMEOUT_MS, screenshot, send

browser = test_browser.browser
log_in = test_browser.log_in

pytestmark = pytest.mark.real_weights

DESKTOP = {"width": 1280, "height": 860}
PHONE = {"width": 390, "height": 844}
QUESTION = "How many days of paid holiday does an employee get?"


@pytest.fixture(scope="module")
def server(chat_model_dir):
    with LiveServer(models_dir=chat_model_dir.parent, env={"CACHET_DEBUG": "0"}) as live:
        live.shell(test_browser.SETUP)
        live.shell(
            "from django.contrib.auth.models import User\n"
            "User.objects.filter(username='carol').update(is_superuser=True)"
        )
        live.start()
        yield live


def add_rated_answer_to_golden_set(server: LiveServer, page) -> None:
    """carol rates her answer up, then adds it to the golden set with the admin's action."""
    send(page, QUESTION)
    answer = page.locator(".message.assistant[data-message-id]").last
    answer.locator('.feedback-button[data-rating="up"]').click()
    answer.locator('.feedback[data-rating="up"]').wait_for(state="attached")
    page.goto(f"{server.url}/admin/chat/answerfeedback/")
    page.locator("#result_list tbody tr").first.locator("input.action-select").check()
    page.select_option("select[name=action]", "add_to_golden_set")
    page.click("button[name=index]")
    page.wait_for_selector(".messagelist")
    assert "1 question added to the golden set." in page.inner_text(".messagelist")
    page.goto(f"{server.url}/admin/evals/goldenquestion/")
    assert QUESTION in page.inner_text("#result_list")
    screenshot(page, "eval-golden-set-admin.png")


def test_staff_make_a_golden_set_run_an_evaluation_and_see_its_row_chart_and_questions(
    server, log_in
) -> None:
    page = log_in("carol", "carol-secret-pw", viewport=DESKTOP)
    add_rated_answer_to_golden_set(server, page)

    page.goto(f"{server.url}/")
    page.click("#evaluation-link")
    page.wait_for_url(f"{server.url}/staff/evaluation/")
    page.wait_for_function("document.querySelector('#golden-summary').textContent.length > 0")
    assert page.inner_text("#golden-summary").startswith("1 active golden question.")
    assert page.locator("#runs-table caption").inner_text() == "No evaluation has run yet."

    page.click("#run-button")
    assert page.is_disabled("#run-button")
    row = page.locator("#runs-table tr[data-run-id]").first
    page.wait_for_selector('#runs-table tr[data-status="done"]', timeout=TIMEOUT_MS * 2)
    assert row.locator("td").nth(0).inner_text() == "Done"
    assert row.locator("td").nth(1).inner_text() == "smollm2-135m-instruct"
    assert row.locator('td[data-metric="recall5"]').inner_text() == "1.000"
    assert float(row.locator('td[data-metric="answer_f1"]').inner_text()) >= 0
    assert "finished" in page.inner_text("#evaluation-status")
    assert not page.is_disabled("#run-button")
    assert int(page.get_attribute("#evaluation-chart", "data-points")) == 4  # 4 lines, 1 run

    page.wait_for_selector("#run-detail:not([hidden])")  # a finished run opens its questions
    [result] = page.locator("#results-table tr.result-row").all()
    assert QUESTION in result.inner_text()
    assert result.locator(".retrieved-list li.expected").count() >= 1
    screenshot(page, "eval-run-desktop.png")

    phone = page.context.new_page()
    phone.set_viewport_size(PHONE)
    phone.goto(f"{server.url}/staff/evaluation/")
    phone.wait_for_selector('#runs-table tr[data-status="done"]')
    assert int(phone.get_attribute("#evaluation-chart", "data-points")) == 4
    chart = phone.locator("#evaluation-chart").bounding_box()
    assert chart is not None and chart["x"] + chart["width"] <= PHONE["width"]
    phone.locator(".run-details").first.click()
    phone.wait_for_selector("#run-detail:not([hidden]) tr.result-row")
    screenshot(phone, "eval-run-phone.png")
    page.context.close()


def test_a_member_never_sees_the_evaluation_page_its_link_or_the_admin(server, log_in) -> None:
    page = log_in("alice", "alice-secret-pw", viewport=PHONE)
    page.wait_for_selector("#connection-status", state="attached")
    assert page.locator("#evaluation-link").count() == 0
    assert page.goto(f"{server.url}/staff/evaluation/").status == 403
    assert page.request.get(f"{server.url}/staff/evaluation/data/").status == 403
    page.goto(f"{server.url}/admin/evals/goldenquestion/")
    assert "/admin/login/" in page.url
    page.context.close()


# What the golden set and the model wrote is left out of the language check; the metrics keep
# their names (recall@5, nDCG@10, MRR@10, F1), as the literature writes them.
KEPT_ON_THE_PAGE = test_browser.KEPT_IN_CHINESE | {"Recall", "recall", "nDCG", "MRR"}


def test_in_chinese_the_evaluation_page_has_no_english_left(server, log_in) -> None:
    page = log_in("carol", "carol-secret-pw", locale="zh-CN", viewport=DESKTOP)
    page.goto(f"{server.url}/staff/evaluation/")
    page.wait_for_function("document.querySelector('#golden-summary').textContent.length > 0")
    if page.locator("#runs-table tr[data-run-id]").count():  # the run of the first test
        page.locator(".run-details").first.click()
        page.wait_for_selector("#run-detail:not([hidden]) tr.result-row")
    assert page.inner_text("#run-button") == "运行评估"
    screenshot(page, "eval-run-zh.png")
    text = page.evaluate(test_browser.INTERFACE_TEXT, {"written": [".text", ".retrieved-list"]})
    words = set(re.findall(r"[A-Za-z]{2,}", text))
    assert words <= KEPT_ON_THE_PAGE, f"English left: {words - KEPT_ON_THE_PAGE}"
    page.context.close()
