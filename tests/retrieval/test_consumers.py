"""retrieval.consumers: live ingestion progress over a staff-only WebSocket."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer

from retrieval.consumers import CLOSE_FORBIDDEN, CLOSE_NOT_FOUND
from retrieval.extract import ExtractionError, extract
from retrieval.ingest import fail
from retrieval.models import Collection, Document
from retrieval.progress import group_name
from tests.websocket_helpers import communicator, make_user

# NOTE: also in the integration pass, where the channel layer is Redis as in production.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration]


@database_sync_to_async
def make_document() -> Document:
    collection = Collection.objects.create(name="c")
    return Document.objects.create(
        collection=collection, title="a.txt", status=Document.Status.PROCESSING, progress=30
    )


async def progress_socket(document_id: int, user):
    return await communicator(f"/ws/documents/{document_id}/progress/", user)


async def test_staff_get_the_current_state_then_live_progress_events() -> None:
    document = await make_document()
    ws = await progress_socket(document.pk, await make_user("staff", is_staff=True))
    try:
        connected, _ = await ws.connect()
        assert connected
        assert await ws.receive_json_from() == {
            "type": "document.progress",
            "document_id": document.pk,
            "status": "processing",
            "progress": 30,
            "error": "",
        }
        await get_channel_layer().group_send(
            group_name(document.pk),
            {
                "type": "document.progress",
                "document_id": document.pk,
                "status": "ready",
                "progress": 100,
                "error": "",
            },
        )
        message = await ws.receive_json_from(timeout=5)
        assert (message["status"], message["progress"]) == ("ready", 100)
    finally:
        await ws.disconnect()


async def test_progress_reported_by_ingestion_reaches_the_socket() -> None:
    from retrieval.progress import report

    document = await make_document()
    ws = await progress_socket(document.pk, await make_user("staff", is_staff=True))
    try:
        assert (await ws.connect())[0]
        await ws.receive_json_from()
        await database_sync_to_async(report)(document, Document.Status.PROCESSING, 55)
        assert (await ws.receive_json_from(timeout=5))["progress"] == 55
    finally:
        await ws.disconnect()


@pytest.mark.parametrize("who", ["anonymous", "member"])
async def test_non_staff_and_anonymous_connections_are_refused(who: str) -> None:
    document = await make_document()
    user = None if who == "anonymous" else await make_user("member", is_staff=False)
    ws = await progress_socket(document.pk, user)
    try:
        connected, code = await ws.connect()
        assert not connected and code == CLOSE_FORBIDDEN
    finally:
        await ws.disconnect()


async def test_a_cross_origin_connection_is_refused_even_for_staff() -> None:
    document = await make_document()
    staff = await make_user("staff", is_staff=True)
    ws = await communicator(
        f"/ws/documents/{document.pk}/progress/", staff, origin=b"http://evil.example"
    )
    try:
        connected, _ = await ws.connect()
        assert not connected
    finally:
        await ws.disconnect()


async def test_an_unknown_document_is_refused() -> None:
    ws = await progress_socket(987_654, await make_user("staff", is_staff=True))
    try:
        connected, code = await ws.connect()
        assert not connected and code == CLOSE_NOT_FOUND
    finally:
        await ws.disconnect()


@database_sync_to_async
def fail_unreadable(document: Document) -> None:
    """Fails `document` as ingestion does for a text in no known encoding."""
    try:
        extract(bytes(range(0x80, 0x100)) * 8, "notes.txt")
    except ExtractionError as error:
        fail(document, error.reason)


@pytest.mark.parametrize(
    ("browser", "reason"),
    [
        ({"accept_language": "zh-CN,zh;q=0.9"}, "无法识别文本的编码"),
        ({"accept_language": "zh-CN", "cookies": {"django_language": "en"}}, "The text's encoding"),
    ],
    ids=["chinese", "switched-to-english"],
)
async def test_a_failure_reason_comes_in_the_language_of_the_page(browser, reason) -> None:
    document = await make_document()
    staff = await make_user("staff", is_staff=True)
    ws = await communicator(f"/ws/documents/{document.pk}/progress/", staff, **browser)
    try:
        assert (await ws.connect())[0]
        await ws.receive_json_from()
        await fail_unreadable(document)  # live: the event of the failure
        message = await ws.receive_json_from(timeout=5)
        assert message["status"] == "failed" and message["error"].startswith(reason), message
    finally:
        await ws.disconnect()
    again = await communicator(f"/ws/documents/{document.pk}/progress/", staff, **browser)
    try:
        assert (await again.connect())[0]  # later: the state sent on connect
        message = await again.receive_json_from()
        assert message["status"] == "failed" and message["error"].startswith(reason), message
    finally:
        await again.disconnect()
