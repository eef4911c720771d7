"""The upload panel's staff tools in Chromium against a real server: a first run offers "General"
and staff create it inline with its readers; a folder and a zip upload with a result per file;
the ingestion queue shows every document live, cancels a running ingestion for good and retries
it; at phone width the tools fit and the queue fills the screen. A member never sees any of it,
and the endpoints refuse them. Screenshots go to CACHET_TEST_ARTIFACTS (see test_browser.py).

The server starts with no collection at all (a fresh `make run`), with tasks run in-process: an
upload's ingestion runs inside its request, so a cancel reaches it from another request.
"""

from __future__ import annotations

import io
import json
import re
import zipfile

import pytest

from harness.live_server import LiveServer
from tests.frontend import test_browser
from tests.frontend.test_browser import TIMEOUT_MS, screenshot

# The chat's browser tests' fixtures: Chromium, and log-in on this module's `server`.
browser = test_browser.browser
log_in = test_browser.log_in

pytestmark = pytest.mark.real_weights

SETUP = """
from django.contrib.auth.models import Group, User

User.objects.create_user("carol", password="carol-secret-pw", is_staff=True)
alice = User.objects.create_user("alice", password="alice-secret-pw")
User.objects.create_user("bob", password="bob-secret-pw")
Group.objects.create(name="Engineering").user_set.add(alice)
"""
# Long enough that its ingestion is seen running (a few hundred chunks to embed).
LONG_TEXT = "\n\n".join(
    f"## Part {n}\n"
    + " ".join(f"Rule {n}.{m}: the archive keeps record {n * 37 + m} for audit." for m in range(45))
    for n in range(90)
)
DESKTOP = {"width": 1280, "height": 860}
PHONE = {"width": 390, "height": 844}


@pytest.fixture(scope="module")
def server(chat_model_dir):
    with LiveServer(models_dir=chat_model_dir.parent, env={"CACHET_DEBUG": "0"}) as live:
        live.shell(SETUP)
        live.start()
        yield live


def chunks_of(server: LiveServer, title: str) -> int:
    code = (
        "from retrieval.models import Chunk\n"
        f"print(Chunk.objects.filter(document__title={title!r}).count())"
    )
    return int(server.shell(code).strip().splitlines()[-1])


def open_upload_panel(page) -> None:
    page.wait_for_selector("#upload-panel:not([hidden])")
    if not page.locator("#upload-details").evaluate("details => details.open"):
        page.click("#upload-details > summary")


def create_general_for_alice(page) -> None:
    """On a first run: the panel offers "General"; create it with alice as a reader."""
    open_upload_panel(page)
    page.wait_for_selector("#new-collection:not([hidden])")
    assert page.locator("#upload-collection option:checked").inner_text() == "General (new)"
    assert page.input_value("#new-collection-name") == "General"
    assert page.is_disabled("#upload-button")
    page.locator("#new-collection-readers label", has_text="alice").click()
    screenshot(page, "kb-first-run-general.png")
    page.click("#new-collection-create")
    page.wait_for_selector("#new-collection", state="hidden")
    assert page.locator("#upload-collection option:checked").inner_text() == "General"
    assert not page.is_disabled("#upload-button")


def collection_names_offered(page) -> list[str]:
    page.wait_for_selector("#collection-picker", state="attached")
    page.wait_for_function("document.querySelector('#collection-options').children.length > 0")
    return page.locator("#collection-options .picker-option").all_inner_texts()


def test_a_first_run_offers_general_which_staff_create_inline_and_only_its_readers_see(
    server, log_in, tmp_path
) -> None:
    page = log_in("carol", "carol-secret-pw", viewport=DESKTOP)
    create_general_for_alice(page)
    notes = tmp_path / "office-notes.md"
    notes.write_text("# Office\n\nThe office kitchen is cleaned every Friday afternoon.\n")
    page.set_input_files("#upload-file", str(notes))
    page.click("#upload-button")
    page.wait_for_selector('.upload-progress[data-status="ready"]')
    screenshot(page, "kb-general-created-and-filled.png")
    page.context.close()

    alice = log_in("alice", "alice-secret-pw", viewport=DESKTOP)
    assert collection_names_offered(alice) == ["General"]
    alice.context.close()
    bob = log_in("bob", "bob-secret-pw", viewport=DESKTOP)
    assert collection_names_offered(bob) == []  # the hint that nothing is available
    bob.context.close()


def write_zip(path, members: dict[str, str]) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, text in members.items():
            archive.writestr(name, text)
    path.write_bytes(buffer.getvalue())


def test_a_folder_and_a_zip_upload_with_a_result_per_file_then_the_queue_shows_them_ready(
    server, log_in, tmp_path
) -> None:
    page = log_in("carol", "carol-secret-pw", viewport=DESKTOP)
    open_upload_panel(page)
    if page.is_visible("#new-collection"):  # run alone: the first test made no collection
        create_general_for_alice(page)
    folder = tmp_path / "handbook"
    (folder / "travel").mkdir(parents=True)
    (folder / "leave.md").write_text("# Leave\n\nThirty days of paid holiday a year.\n")
    (folder / "travel" / "trains.txt").write_text("Trains are preferred under 600 km.\n")
    (folder / "logo.png").write_bytes(b"\x89PNG\r\n")
    archive = tmp_path / "policies.zip"
    write_zip(
        archive,
        {"security.md": "# Security\n\nBadges are worn.\n", "../escape.md": "x", "tool.exe": "MZ"},
    )
    page.set_input_files("#bulk-folder", str(folder))
    page.set_input_files("#bulk-files", str(archive))
    page.click("#bulk-button")
    page.wait_for_selector("#ingestion-queue[open]")
    page.wait_for_function("document.querySelectorAll('.bulk-result').length === 6")
    outcomes = {
        item.locator(".bulk-name").inner_text(): item.get_attribute("data-outcome")
        for item in page.locator(".bulk-result").all()
    }
    assert outcomes == {
        "handbook/leave.md": "queued",
        "handbook/logo.png": "skipped",
        "handbook/travel/trains.txt": "queued",
        "policies.zip/security.md": "queued",
        "policies.zip/../escape.md": "skipped",
        "policies.zip/tool.exe": "skipped",
    }
    for title in ("leave.md", "trains.txt", "security.md"):
        page.wait_for_selector(
            f'.queue-item[data-status="ready"] .queue-title:text-is("{title}")', timeout=TIMEOUT_MS
        )
    summary = page.inner_text("#queue-summary")
    assert "queued" not in summary and "running" not in summary
    screenshot(page, "kb-queue-after-bulk-upload.png")
    page.click("#queue-close")
    page.wait_for_selector("#ingestion-queue", state="hidden")
    assert "Skipped: unsafe path" in page.inner_text("#bulk-results")
    screenshot(page, "kb-bulk-results.png")
    page.context.close()


def test_cancel_stops_a_running_ingestion_for_good_and_retry_ingests_it_again(
    server, log_in, tmp_path
) -> None:
    page = log_in("carol", "carol-secret-pw", viewport=DESKTOP)
    open_upload_panel(page)
    if page.is_visible("#new-collection"):
        create_general_for_alice(page)
    long_file = tmp_path / "archive-rules.md"
    long_file.write_text(LONG_TEXT)
    page.set_input_files("#bulk-files", str(long_file))
    page.click("#bulk-button")
    item = page.locator(".queue-item", has=page.locator('.queue-title:text-is("archive-rules.md")'))
    page.wait_for_selector('.queue-item[data-status="processing"]', timeout=TIMEOUT_MS)
    screenshot(page, "kb-queue-running.png")
    item.locator(".queue-cancel").click()
    page.wait_for_selector('.queue-item[data-status="cancelled"]')
    assert item.locator(".queue-status").inner_text() == "Cancelled"
    assert item.locator(".queue-retry").is_visible()
    assert not item.locator(".queue-cancel").is_visible()
    page.wait_for_function("document.querySelector('#bulk-status').textContent.includes('queued')")
    page.wait_for_timeout(1500)  # a run that had not stopped would be storing chunks by now
    assert chunks_of(server, "archive-rules.md") == 0
    assert item.get_attribute("data-status") == "cancelled"
    screenshot(page, "kb-queue-cancelled.png")

    item.locator(".queue-retry").click()
    page.wait_for_function(
        """() => [...document.querySelectorAll('.queue-item')].some((item) =>
          item.textContent.includes('archive-rules.md') && item.dataset.status === 'ready')""",
        timeout=TIMEOUT_MS * 2,
    )
    assert chunks_of(server, "archive-rules.md") > 50
    page.context.close()


def test_at_phone_width_the_tools_fit_the_drawer_and_the_queue_fills_the_screen(
    server, log_in
) -> None:
    page = log_in("carol", "carol-secret-pw", viewport=PHONE)
    page.click("#menu-button")
    page.wait_for_function("document.getElementById('sidebar').getBoundingClientRect().left >= 0")
    open_upload_panel(page)
    page.wait_for_selector("#bulk-upload", state="visible")
    # NOTE: the panel's own width; the footer's links are another feature's.
    overflow = page.evaluate(
        "() => { const panel = document.getElementById('upload-panel');"
        " return panel.scrollWidth - panel.clientWidth; }"
    )
    assert overflow <= 0
    screenshot(page, "kb-phone-upload-panel.png")
    page.click("#queue-open")
    page.wait_for_selector("#ingestion-queue[open] .queue-item, #queue-empty:not([hidden])")
    box = page.locator("#ingestion-queue").bounding_box()
    assert box["width"] >= PHONE["width"] - 2 and box["height"] >= PHONE["height"] - 2
    screenshot(page, "kb-phone-queue.png")
    page.context.close()


MEMBER_REQUESTS = """async () => {
  const csrf = document.cookie.split("; ").find((c) => c.startsWith("csrftoken=")).split("=")[1];
  const post = (path, body) => fetch(path, {method: "POST", headers: {"X-CSRFToken": csrf,
    "Content-Type": "application/json"}, body: JSON.stringify(body || {})});
  const options = await (await fetch("/chat/api/options/")).json();
  const form = new FormData();
  form.append("collection", "1");
  form.append("file", new Blob(["# Mine"]), "mine.md");
  return {
    options,
    queue: (await fetch("/chat/api/documents/queue/")).status,
    cancel: (await post("/chat/api/documents/1/cancel/")).status,
    retry: (await post("/chat/api/documents/1/retry/")).status,
    collection: (await post("/chat/api/collections/", {name: "Mine"})).status,
    bulk: (await fetch("/chat/api/documents/bulk/", {method: "POST",
      headers: {"X-CSRFToken": csrf}, body: form})).status,
  };
}"""


def test_a_member_never_sees_the_staff_tools_and_the_endpoints_refuse_them(server, log_in) -> None:
    for viewport in (DESKTOP, PHONE):
        page = log_in("alice", "alice-secret-pw", viewport=viewport)
        page.wait_for_selector('#connection-status[data-state="open"]', state="attached")
        page.wait_for_function("document.querySelector('#collection-options').children.length > 0")
        assert page.locator("#upload-panel").is_hidden()
        for staff_only in ("#new-collection", "#bulk-upload", "#queue-open", "#ingestion-queue"):
            assert page.locator(staff_only).count() == 0, staff_only
        answers = page.evaluate(MEMBER_REQUESTS)
        upload = answers.pop("options")["upload"]
        assert upload["allowed"] is False and "readers" not in upload
        assert "bob" not in json.dumps(upload) and "carol" not in json.dumps(upload)
        assert set(answers.values()) == {403}, answers
        page.context.close()


# What users and documents wrote (titles, names) is left out of the language check.
# A unit and a format's name stay Latin in Chinese text too.
KEPT_IN_CHINESE = test_browser.KEPT_IN_CHINESE | {"MB", "zip"}
# What people wrote: document titles and collection names (a progress bar's label quotes its
# document's title: the title is written, the words around it are not).
WRITTEN_ON_THE_QUEUE = """() => ({
  written: [".queue-title", ".queue-collection", ".bulk-name", ".upload-name",
    "#upload-collection option:not([value=new])", "#new-collection-readers .picker-option span",
    "#new-collection-name"],
  names: [...document.querySelectorAll(".queue-title")].map((title) => title.textContent),
})"""


def test_in_chinese_the_staff_tools_and_the_queue_have_no_english_left(
    server, log_in, tmp_path
) -> None:
    server.shell(  # run alone: the first test made no collection
        "from retrieval.models import Collection\n"
        "if not Collection.objects.exists(): Collection.objects.create(name='General')"
    )
    page = log_in("carol", "carol-secret-pw", locale="zh-CN", viewport=DESKTOP)
    open_upload_panel(page)
    # An upload that fails: the queue says why in Chinese too (stored in no language).
    blank = tmp_path / "blank.txt"
    blank.write_text("   \n\n   \n")
    page.set_input_files("#bulk-files", str(blank))
    page.click("#bulk-button")
    failed = page.locator(
        '.queue-item[data-status="failed"]', has=page.locator('.queue-title:text-is("blank.txt")')
    )
    failed.wait_for(timeout=TIMEOUT_MS)
    status = failed.locator(".queue-status").inner_text()
    assert status == "失败：文件中只有空白字符。", status  # noqa: RUF001
    page.click("#queue-close")
    page.wait_for_selector("#ingestion-queue", state="hidden")
    page.select_option("#upload-collection", value="new")
    page.wait_for_selector("#new-collection:not([hidden])")
    page.click("#queue-open")
    page.wait_for_selector("#ingestion-queue[open] .queue-item, #queue-empty:not([hidden])")
    # NOTE: titles read and text read in one task: the queue re-renders its items while others'
    # documents are still ingesting.
    text = page.evaluate(f"() => ({test_browser.INTERFACE_TEXT})(({WRITTEN_ON_THE_QUEUE})())")
    words = set(re.findall(r"[A-Za-z]{2,}", text))
    assert words <= KEPT_IN_CHINESE, f"English left: {words - KEPT_IN_CHINESE}"
    assert "导入队列" in page.inner_text("#ingestion-queue")
    screenshot(page, "kb-queue-zh.png")
    page.context.close()
