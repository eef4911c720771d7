"""Cited passages in place and the retrieval test page, in headless Chromium against a real server.

A citation opens its document beside the answer on a wide screen (the cited span in a <mark>,
scrolled into view, Escape and the close button give focus back) and as a page on a phone; a PDF
source shows its page. Staff run the retrieval test page at both widths and open a candidate in
context. Others never see it, and never a document of a collection they may not read, through
the panel or its endpoint. Screenshots go where test_browser.py puts them.
"""

from __future__ import annotations

import json
import re

import pytest

from harness.live_server import LiveServer
from tests.frontend import test_browser
from tests.frontend.test_browser import HANDBOOK, screenshot
from tests.retrieval.test_extract import make_pdf

pytestmark = pytest.mark.real_weights

# test_browser.py's browser and log-in, on this module's server (the fixture `server` below).
browser = test_browser.browser
log_in = test_browser.log_in

DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 375, "height": 740}
DOCUMENT_PAGE = re.compile(r"/documents/\d+/\?chunk=\d+")
MANUAL_PAGES = [
    "The front desk opens at eight in the morning.",
    "The archive is kept on the second floor behind the library.",
    "Visitors sign the guest book at the entrance.",
]
SETUP = f"""
import json
from django.contrib.auth.models import User
from django.core.files.base import ContentFile
from chat.models import Conversation, Message
from chat.prompt import source_json
from retrieval.ingest import ingest
from retrieval.models import Collection, Document
from retrieval.search import get_retriever, search

alice = User.objects.create_user("alice", password="alice-secret-pw")
bob = User.objects.create_user("bob", password="bob-secret-pw")
User.objects.create_user("carol", password="carol-secret-pw", is_staff=True)
library = Collection.objects.create(name="Library")
library.readers.add(alice)
files = (("handbook.md", {HANDBOOK.encode()!r}), ("manual.pdf", {make_pdf(MANUAL_PAGES)!r}))
for title, data in files:
    document = Document.objects.create(
        collection=library, title=title, file=ContentFile(data, name=title)
    )
    ingest(document.pk, get_retriever())
holiday = search("paid holiday each year", [library], top_k=1)[0]
archive = search("archive second floor", [library], top_k=1)[0]
assert holiday.document_title == "handbook.md" and archive.page == 2, (holiday, archive)

def conversation(owner, hits):
    chat = Conversation.objects.create(owner=owner, title="Leave and the archive")
    Message.objects.create(conversation=chat, role="user", content="Leave? Archive?")
    Message.objects.create(
        conversation=chat, role="assistant",
        content="Employees get thirty days of paid holiday [1]. The archive is upstairs [2].",
        sources=[source_json(n, hit) for n, hit in enumerate(hits, start=1)],
    )
    return chat.pk

print(json.dumps({{
    "alice": conversation(alice, [holiday, archive]),
    # bob is no reader of the library: a conversation citing it must not open it for him
    "bob": conversation(bob, [holiday, archive]),
    "handbook": holiday.document_id, "holiday_chunk": holiday.chunk_id,
}}))
"""


@pytest.fixture(scope="module")
def server(chat_model_dir):
    with LiveServer(models_dir=chat_model_dir.parent, env={"CACHET_DEBUG": "0"}) as live:
        live.site = json.loads(live.shell(SETUP).strip().splitlines()[-1])
        live.start()
        yield live


def open_conversation(page, server, conversation_id: int) -> None:
    page.goto(f"{server.url}/c/{conversation_id}/")
    page.wait_for_selector(".message.assistant a.citation")


def focused(page) -> str:
    return page.evaluate(
        "() => { const f = document.activeElement;"
        " return f.id || (f.className + ' ' + (f.dataset.n || '')); }"
    )


def test_a_citation_opens_its_document_beside_the_answer_with_the_passage_marked(
    server, log_in
) -> None:
    page = log_in("alice", "alice-secret-pw", viewport=DESKTOP)
    open_conversation(page, server, server.site["alice"])
    page.click('.message.assistant a.citation[data-n="1"]')
    mark = page.locator("#source-panel mark.cited-span")
    mark.wait_for(state="visible")
    assert "thirty days of paid holiday" in mark.inner_text()
    assert page.locator("#source-panel mark").count() == 1
    assert page.inner_text("#source-panel-title") == "handbook.md"
    assert focused(page) == "source-panel-title"
    # Beside the answer, not over it; the marked span is inside the panel's visible part.
    panel, main = page.locator("#source-panel").bounding_box(), page.locator("#main").bounding_box()
    assert main["x"] + main["width"] <= panel["x"] + 1
    box = mark.bounding_box()
    assert panel["y"] <= box["y"] and box["y"] + box["height"] <= panel["y"] + panel["height"]
    screenshot(page, "source-panel-desktop.png")

    page.keyboard.press("Escape")
    page.wait_for_selector("#source-panel", state="hidden")
    assert focused(page).strip() == "citation 1"

    # A PDF source: its page is named, and the span is marked on it.
    page.click('.message.assistant .source-item[data-n="2"] a.source-link')
    mark.wait_for(state="visible")
    assert "second floor" in mark.inner_text()
    assert "page 2" in page.inner_text("#source-panel-meta")
    labels = page.locator("#source-panel .block-page").all_inner_texts()
    assert labels == ["page 1", "page 2", "page 3"]
    marked_page = page.locator("#source-panel .text-block", has=page.locator("mark.cited-span"))
    assert marked_page.locator(".block-page").inner_text() == "page 2"
    screenshot(page, "source-panel-pdf-desktop.png")
    page.click("#source-panel-close")
    page.wait_for_selector("#source-panel", state="hidden")
    assert focused(page).strip() == "source-link"
    page.context.close()


def test_at_a_middling_width_the_panel_lies_over_the_chats_right_side(server, log_in) -> None:
    page = log_in("alice", "alice-secret-pw", viewport={"width": 900, "height": 760})
    open_conversation(page, server, server.site["alice"])
    page.click('.message.assistant a.citation[data-n="1"]')
    page.locator("#source-panel mark.cited-span").wait_for(state="visible")
    panel = page.locator("#source-panel").bounding_box()
    assert panel["x"] + panel["width"] == 900 and 0 < panel["width"] < 900 - 280
    assert page.locator("#main").bounding_box()["width"] == 900 - 280  # the chat keeps its width
    screenshot(page, "source-panel-tablet.png")
    page.keyboard.press("Escape")
    page.wait_for_selector("#source-panel", state="hidden")
    page.context.close()


def test_the_panel_speaks_the_readers_language(server, log_in) -> None:
    page = log_in("alice", "alice-secret-pw", viewport=DESKTOP, locale="zh-CN")
    open_conversation(page, server, server.site["alice"])
    page.click('.message.assistant a.citation[data-n="2"]')
    page.locator("#source-panel mark.cited-span").wait_for(state="visible")
    assert "引用段落在第 2 页" in page.inner_text("#source-panel-meta")
    assert page.get_attribute("#source-panel-close", "aria-label") == "关闭引用来源"
    assert page.inner_text("#source-panel-page-link") == "在页面中打开"
    assert page.locator("#source-panel .block-page").all_inner_texts()[1] == "第 2 页"
    screenshot(page, "source-panel-pdf-zh-desktop.png")
    page.context.close()


def test_on_a_phone_a_citation_opens_the_documents_page_at_the_marked_passage(
    server, log_in
) -> None:
    page = log_in("alice", "alice-secret-pw", viewport=PHONE)
    open_conversation(page, server, server.site["alice"])
    page.click('.message.assistant a.citation[data-n="2"]')
    page.wait_for_url(DOCUMENT_PAGE)
    mark = page.locator("mark.cited-span")
    assert "second floor" in mark.inner_text()
    assert "Cited passage on page 2" in page.inner_text(".document-meta")
    page.wait_for_function(
        "() => { const r = document.querySelector('mark.cited-span').getBoundingClientRect();"
        " return r.top >= 0 && r.bottom <= window.innerHeight; }"
    )
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    screenshot(page, "source-page-phone.png")
    page.click(".back-link")
    page.wait_for_url(f"{server.url}/c/{server.site['alice']}/")
    page.context.close()


def test_a_user_never_opens_a_document_of_a_collection_they_may_not_read(server, log_in) -> None:
    page = log_in("bob", "bob-secret-pw", viewport=DESKTOP)
    open_conversation(page, server, server.site["bob"])
    page.click('.message.assistant a.citation[data-n="1"]')
    page.wait_for_selector("#source-panel:not([aria-busy])")
    status = page.inner_text("#source-panel-status")
    assert "not available to you" in status
    assert page.locator("#source-panel mark").count() == 0
    assert "thirty days" not in page.inner_text("#source-panel")
    screenshot(page, "source-panel-refused-desktop.png")

    handbook, chunk = server.site["handbook"], server.site["holiday_chunk"]
    assert page.request.get(f"{server.url}/documents/{handbook}/text/?chunk={chunk}").status == 404
    assert page.request.get(f"{server.url}/documents/{handbook}/?chunk={chunk}").status == 404
    # Nor the staff tools: no link, and the page itself refuses.
    assert page.locator("#retrieval-test-link").count() == 0
    assert page.request.get(f"{server.url}/staff/retrieval/?query=holiday").status == 403
    page.context.close()


def test_staff_test_retrieval_and_open_a_candidate_in_context(server, log_in) -> None:
    page = log_in("carol", "carol-secret-pw", viewport=DESKTOP)
    page.click("#retrieval-test-link")
    page.wait_for_url(f"{server.url}/staff/retrieval/")
    page.fill("#id_query", "paid holiday each year")
    page.select_option("#id_collections", label="Library")
    page.fill("#id_top_k", "1")
    page.click("#retrieval-run")
    page.wait_for_selector("#pool-table")
    assert page.locator("tr.candidate.kept").count() == 1
    assert page.locator("tr.candidate.dropped").count() >= 1
    assert page.locator("#cutoff-row").is_visible()
    assert "Top-K is 1" in page.inner_text("#cutoff-reason")
    top = page.locator("tr.candidate").first
    for cell in ("td.lexical", "td.dense", "td.fused", "td.final", "td.fused-rank"):
        assert any(ch.isdigit() for ch in top.locator(cell).inner_text()), cell
    screenshot(page, "retrieval-test-desktop.png")

    top.locator("a.open-in-context").click()
    page.wait_for_url(DOCUMENT_PAGE)
    assert "thirty days of paid holiday" in page.locator("mark.cited-span").inner_text()
    page.context.close()


def test_the_retrieval_test_page_reads_as_cards_on_a_phone(server, log_in) -> None:
    page = log_in("carol", "carol-secret-pw", viewport=PHONE)
    page.goto(f"{server.url}/staff/retrieval/?query=archive+second+floor&top_k=2")
    page.wait_for_selector("#pool-table")
    assert not page.locator("#pool-table thead").is_visible()
    assert page.locator("tr.candidate.kept").count() == 2
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    screenshot(page, "retrieval-test-phone.png")
    page.context.close()
