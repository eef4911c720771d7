"""The browser UI end to end: headless Chromium against a real server process and the real model.

Log in, ask about an ingested document, see the dots, then streamed text, then the sources; stop
works mid-answer; a second user cannot open the first user's chat; a browser that prefers Chinese
gets the interface in Chinese, and the language switch goes back to English. The server runs as
`make run` does: DEBUG off, static files collected and served by their hashed names. Every page a
test opens is watched: an uncaught JavaScript error, a console error or a static file that fails
to load fails the test. Screenshots are saved under CACHET_TEST_ARTIFACTS (default
var/test-artifacts) as test artifacts.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

import pytest

import frontend
from harness.live_server import LiveServer

pytestmark = pytest.mark.real_weights

CHROMIUM = Path("/usr/bin/chromium")
CHAT_MODULES_DIR = Path(frontend.__file__).parent / "static" / "frontend" / "chat"
CHAT_MODULES_URL = "/static/frontend/chat/"
HASHED_MODULE = re.compile(r"\.[0-9a-f]{12}\.js$")
ARTIFACTS_DIR = Path(os.environ.get("CACHET_TEST_ARTIFACTS", "var/test-artifacts"))
HANDBOOK = (
    "# Staff handbook\n\n## Leave\nEvery employee gets thirty days of paid holiday each year. "
    "Unused holiday can be carried over until the end of March.\n\n## Travel\nTrains are "
    "preferred over flights for trips shorter than 600 kilometres.\n"
)
SETUP = f"""
from django.contrib.auth.models import User
from django.core.files.base import ContentFile
from chat.models import AssistantProfile
from retrieval.ingest import ingest
from retrieval.models import Collection, Document
from retrieval.search import get_retriever

alice = User.objects.create_user("alice", password="alice-secret-pw")
User.objects.create_user("bob", password="bob-secret-pw")
User.objects.create_user("carol", password="carol-secret-pw", is_staff=True)
wei = User.objects.create_user("wei", password="wei-secret-pw")
handbook = Collection.objects.create(name="Handbook")
handbook.readers.add(alice, wei)
document = Document.objects.create(
    collection=handbook, title="handbook.md",
    file=ContentFile({HANDBOOK!r}.encode(), name="handbook.md"),
)
ingest(document.pk, get_retriever())
AssistantProfile.objects.create(name="Assistant", is_default=True, temperature=0, max_tokens=160)
"""
TIMEOUT_MS = 90_000


@pytest.fixture(scope="module")
def server(chat_model_dir):
    # NOTE: CACHET_DEBUG=0 as `make run`: the pages load the hashed modules `collectstatic` wrote.
    with LiveServer(models_dir=chat_model_dir.parent, env={"CACHET_DEBUG": "0"}) as live:
        live.shell(SETUP)
        live.start()
        yield live


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.fail("the browser tests need Debian's chromium: apt-get install chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        # NOTE: launch() runs Chromium on a fresh temporary profile of its own each time.
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM),
            args=["--no-sandbox", "--disable-background-networking", "--disable-component-update"],
        )
        yield browser
        browser.close()


def watch_for_errors(context, errors: list[str]) -> None:
    """Collect into `errors` what goes wrong in the pages of `context`, as the browser says."""
    context.on("weberror", lambda error: errors.append(f"uncaught: {error.error}"))

    def on_console(message) -> None:
        # NOTE: a page the test expects to fail (bob's 404) logs "Failed to load resource";
        # static files are checked by status below instead.
        if message.type == "error" and not message.text.startswith("Failed to load resource"):
            errors.append(f"console: {message.text}")

    def on_response(response) -> None:
        if "/static/" in response.url and response.status >= 400:
            errors.append(f"static file {response.url}: {response.status}")

    def on_request_failed(request) -> None:
        # NOTE: a request cut short by leaving the page (net::ERR_ABORTED) is no error.
        if "/static/" in request.url and "ERR_ABORTED" not in (request.failure or ""):
            errors.append(f"static file {request.url}: {request.failure}")

    context.on("console", on_console)
    context.on("response", on_response)
    context.on("requestfailed", on_request_failed)


@pytest.fixture
def log_in(browser, server):
    """`log_in(username, password, **context_options)`: a page on the chat, in a new context,
    once its socket is open.

    The browser asks for US English unless `locale` says otherwise (Playwright's Chromium would
    send its own default). With `on_login_page(page)`, that is called on the login page first.
    The test fails if any page it opened reported an error (see `watch_for_errors`).
    """
    errors: list[str] = []

    def log_in_as(username: str, password: str, *, on_login_page=None, **context_options):
        context = browser.new_context(**{"locale": "en-US", **context_options})
        watch_for_errors(context, errors)
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        page.goto(f"{server.url}/")
        assert page.url.startswith(f"{server.url}/login/")
        if on_login_page is not None:
            on_login_page(page)
        page.fill("#id_username", username)
        page.fill("#id_password", password)
        page.click(".login-form button[type=submit]")
        page.wait_for_url(f"{server.url}/")
        # NOTE: the composer sends nothing until the socket is open (a question typed before
        # stays in the box), so a test that asks at once must wait for it; a busy CI machine
        # opened it after the first Enter.
        page.wait_for_selector('#connection-status[data-state="open"]', state="attached")
        return page

    yield log_in_as
    assert not errors, "the browser reported errors:\n" + "\n".join(errors)


def screenshot(page, name: str) -> None:
    ARTIFACTS_DIR.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS_DIR / name), full_page=True)


RECORD_STREAM = """() => {
  window.__contentLengths = [];
  const observer = new MutationObserver(() => {
    const bubbles = document.querySelectorAll('.message.assistant .content');
    const last = bubbles[bubbles.length - 1];
    if (last) window.__contentLengths.push(last.textContent.length);
  });
  observer.observe(document.getElementById('messages'),
                   {childList: true, subtree: true, characterData: true});
}"""


def send(page, text: str) -> None:
    page.fill("#message-input", text)
    page.keyboard.press("Enter")


def test_a_user_asks_about_a_document_and_sees_dots_then_streamed_text_then_sources(
    server, log_in
) -> None:
    page = log_in("alice", "alice-secret-pw")
    page.evaluate(RECORD_STREAM)
    # NOTE: a question that takes a sentence to answer: the bundled 135M model answers "how
    # many days" with a bare number on some CPUs (bf16 rounding differs between AMX and
    # AVX512-BF16), too short to watch stream.
    question = "What does the handbook say about paid holiday? Answer in one full sentence."
    send(page, question)

    # The question shows at once, then the dots, then tokens replace them.
    assert page.locator(".message.user").last.inner_text().strip() == question
    page.wait_for_selector(".message.assistant .typing-dots", state="visible")
    page.wait_for_selector(".message.assistant .stats", state="visible")
    screenshot(page, "chat-answer.png")
    assert page.locator(".message.assistant .typing-dots").count() == 0

    answer = page.locator(".message.assistant .content").last.inner_text()
    assert answer.strip()
    lengths = page.evaluate("window.__contentLengths")
    growth = sorted({n for n in lengths if n > 0})
    assert len(growth) >= 3, f"the answer did not stream: {lengths}"

    sources = page.locator(".message.assistant .sources a.source-link")
    assert sources.count() >= 1
    assert "handbook.md" in sources.first.inner_text()
    stats = page.locator(".message.assistant .stats").last.inner_text()
    assert "TTFT" in stats
    split = re.search(r"([\d,]+) prompt tokens: ([\d,]+) cache hit, ([\d,]+) miss", stats)
    assert split, stats
    prompt_tokens, hit, miss = (int(count.replace(",", "")) for count in split.groups())
    assert hit + miss == prompt_tokens > 0

    # The chat is listed and its URL is the conversation's.
    page.wait_for_url(f"{server.url}/c/*/")
    assert page.locator("#conversation-list li[data-conversation-id]").count() == 1

    # The source link opens the document at the cited passage.
    href = sources.first.get_attribute("href")
    document_page = page.context.new_page()
    document_page.goto(f"{server.url}{href}")
    assert "thirty days of paid holiday" in document_page.inner_text("body")
    document_page.close()
    page.context.close()


def test_the_chat_page_runs_on_the_hashed_modules_that_collectstatic_wrote(log_in) -> None:
    page = log_in("alice", "alice-secret-pw")
    page.wait_for_selector('#connection-status[data-state="open"]', state="attached")
    loaded = page.evaluate("performance.getEntriesByType('resource').map((entry) => entry.name)")
    modules = [PurePosixPath(urlsplit(url).path).name for url in loaded if CHAT_MODULES_URL in url]
    assert modules and all(HASHED_MODULE.search(name) for name in modules), modules
    unhashed = sorted(HASHED_MODULE.sub(".js", name) for name in modules)
    assert unhashed == sorted(path.name for path in CHAT_MODULES_DIR.glob("*.js"))
    page.context.close()


def test_stop_ends_the_answer_mid_stream_and_keeps_what_was_written(log_in) -> None:
    page = log_in("alice", "alice-secret-pw", viewport={"width": 375, "height": 740})
    send(page, "Write a long, detailed story about a lighthouse keeper and the sea.")
    page.wait_for_function(
        "() => { const c = document.querySelectorAll('.message.assistant .content');"
        " return c.length && c[c.length - 1].textContent.trim().length > 20; }"
    )
    page.click("#stop-button")
    stats = page.locator(".message.assistant .stats").last
    stats.wait_for(state="visible")
    answer = page.locator(".message.assistant").last
    assert "stopped" in answer.inner_text().lower()
    text_at_stop = answer.locator(".content").inner_text()
    page.wait_for_timeout(1000)
    assert answer.locator(".content").inner_text() == text_at_stop  # nothing more arrives
    assert page.locator("#send-button").is_visible()
    screenshot(page, "chat-stopped-phone.png")
    page.context.close()


def test_a_second_user_cannot_open_the_first_users_chat(server, log_in) -> None:
    alice = log_in("alice", "alice-secret-pw")
    alice.wait_for_selector("#conversation-list li[data-conversation-id]")
    conversation_id = alice.get_attribute(
        "#conversation-list li[data-conversation-id]", "data-conversation-id"
    )
    alice.context.close()

    bob = log_in("bob", "bob-secret-pw")
    bob.wait_for_load_state("networkidle")  # the sidebar's list has loaded
    assert bob.locator("#conversation-list li[data-conversation-id]").count() == 0
    response = bob.goto(f"{server.url}/c/{conversation_id}/")
    assert response.status == 404
    api = bob.request.get(f"{server.url}/chat/api/conversations/{conversation_id}/")
    assert api.status == 404
    bob.context.close()


def test_staff_upload_a_document_and_watch_it_become_ready(log_in, tmp_path) -> None:
    page = log_in("carol", "carol-secret-pw")
    notes = tmp_path / "office-notes.md"
    notes.write_text("# Office\n\nThe office kitchen is cleaned every Friday afternoon.\n")
    page.click("#upload-details > summary")
    page.select_option("#upload-collection", label="Handbook")
    page.set_input_files("#upload-file", str(notes))
    page.click("#upload-button")
    progress = page.locator(".upload-progress").first
    page.wait_for_selector('.upload-progress[data-status="ready"]')
    assert "office-notes.md" in progress.inner_text()
    assert "Ready" in progress.inner_text()
    page.context.close()


# The interface's own text on a page, where a reader sees or hears it: visible text and the
# labels, titles and placeholders, outside what users, documents and the model wrote.
# The interface's own words on the page. What people wrote (messages, titles, names) is left out:
# the selectors below plus `written` (more selectors) and `names` (strings cut out of a label that
# quotes one). It only reads the page: a test that removed nodes instead broke the page's own
# scripts when they re-rendered what it removed.
INTERFACE_TEXT = """(options) => {
  const {written: moreWritten = [], names = []} = options || {};  // Playwright passes null
  const written = [".message .content", ".message.user", ".source-list", "#conversation-list",
    "#conversation-title", "#conversation-meta", "#collection-options", "#profile-select",
    ".user-row", ".brand", ".language-option[lang=en]",
    "script", "style", "noscript", ...moreWritten].join(", ");
  const unnamed = (text) => names.reduce((rest, name) => rest.split(name).join(""), text);
  const texts = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  while (walker.nextNode()) {
    const parent = walker.currentNode.parentElement;
    if (parent && !parent.closest(written) && parent.checkVisibility()) {
      texts.push(walker.currentNode.nodeValue);
    }
  }
  for (const element of document.body.querySelectorAll("[aria-label], [title], [placeholder]")) {
    if (element.closest(written)) continue;
    for (const name of ["aria-label", "title", "placeholder"]) {
      // NOTE: the stats' title names the model.
      if (name === "title" && element.classList.contains("stats")) continue;
      if (element.getAttribute(name)) texts.push(unnamed(element.getAttribute(name)));
    }
  }
  return texts.join("\\n");
}"""
CHINESE_STATS = re.compile(r"首字延迟 [\d.]+ 秒 · [\d.]+ 词元/秒 · 提示词 [\d,]+ 词元：缓存命中")  # noqa: RUF001
# Latin words the Chinese interface keeps: the product, keys, a format's name.
KEPT_IN_CHINESE = {"Cachet", "Enter", "Shift", "Esc", "Markdown"}


def assert_all_chinese(page) -> None:
    words = set(re.findall(r"[A-Za-z]{2,}", page.evaluate(INTERFACE_TEXT)))
    assert words <= KEPT_IN_CHINESE, (
        f"English left in the Chinese interface: {words - KEPT_IN_CHINESE}"
    )


# The conversation list's tooltips end with the time of the last change, in the page's language
# (Intl's medium date and short time): 2026年12月6日 05:21 / Dec 6, 2026, 5:21 AM.
ZH_DATE_TIME = re.compile(r"\n\d{4}年\d{1,2}月\d{1,2}日 \d{1,2}:\d{2}$")
EN_DATE_TIME = re.compile(r"\n[A-Z][a-z]{2} \d{1,2}, \d{4}, \d{1,2}:\d{2}\s?[AP]M$")


def conversation_tooltip(page) -> str:
    link = page.locator("#conversation-list .conversation-link[aria-current=page]")
    link.wait_for(state="attached")
    return link.get_attribute("title") or ""


def switch_language(page, language: str) -> None:
    with page.expect_navigation():
        page.click(f"#language-switch button[value={language}]")
    assert page.get_attribute("html", "lang") == language


def test_a_browser_that_prefers_chinese_gets_the_whole_chat_in_chinese_then_switches_to_english(
    server, log_in
) -> None:
    def login_page_in_chinese(page) -> None:
        assert page.get_attribute("html", "lang") == "zh-hans"
        assert page.inner_text("label[for=id_username]") == "用户名"
        assert page.inner_text(".login-form button[type=submit]") == "登录"
        assert page.locator("#language-switch button[aria-current=true]").inner_text() == "简体中文"
        screenshot(page, "login-zh.png")

    page = log_in(
        "wei", "wei-secret-pw", on_login_page=login_page_in_chinese, locale="zh-CN",
        viewport={"width": 1280, "height": 800},
    )  # fmt: skip
    assert page.inner_text("#conversation-title") == "新对话"
    assert page.get_attribute("#message-input", "placeholder") == "输入你的问题…"
    page.wait_for_selector('#connection-status[data-state="open"]', state="attached")
    assert page.inner_text("#connection-status") == "已连接"

    send(page, "How many days of paid holiday does an employee get?")
    page.wait_for_selector(".message.assistant .stats", state="visible")
    stats = page.locator(".message.assistant .stats").last.inner_text()
    assert CHINESE_STATS.search(stats), stats
    assert (
        page.locator(".message.assistant .sources-toggle").last.inner_text().startswith("引用来源")
    )
    assert page.locator(".message.assistant .regenerate-button").inner_text() == "重新生成"
    assert_all_chinese(page)
    tooltip = conversation_tooltip(page)
    assert ZH_DATE_TIME.search(tooltip), tooltip  # the date in Chinese order
    screenshot(page, "chat-answer-zh.png")

    page.wait_for_url(f"{server.url}/c/*/")
    conversation_url = page.url
    switch_language(page, "en")
    assert page.url == conversation_url  # the same conversation, now in English
    page.wait_for_selector(".message.assistant .stats", state="visible")
    assert "TTFT" in page.locator(".message.assistant .stats").last.inner_text()
    assert page.get_attribute("#message-input", "placeholder") == "Ask a question…"
    tooltip = conversation_tooltip(page)
    assert EN_DATE_TIME.search(tooltip), tooltip  # the page's language, not the browser's (zh-CN)
    screenshot(page, "chat-answer-en-after-switch.png")
    page.context.close()


def test_at_phone_width_the_chinese_interface_keeps_the_switch_in_the_sidebar(log_in) -> None:
    page = log_in("wei", "wei-secret-pw", locale="zh-CN", viewport={"width": 375, "height": 740})
    page.wait_for_selector('#connection-status[data-state="open"]', state="attached")
    assert page.inner_text("#composer-hint") == "Enter 发送 · Shift+Enter 换行"
    assert_all_chinese(page)
    assert not page.is_visible("#language-switch")  # in the closed drawer
    page.click("#menu-button")
    page.wait_for_selector("#language-switch", state="visible")
    page.wait_for_function("document.getElementById('sidebar').getBoundingClientRect().left >= 0")
    screenshot(page, "chat-zh-phone.png")

    switch_language(page, "en")
    assert page.get_attribute("#message-input", "placeholder") == "Ask a question…"
    page.reload()  # the choice is kept (Django's language cookie), whatever the browser prefers
    assert page.get_attribute("html", "lang") == "en"
    page.context.close()
