"""chat.prompt: the newest user turn (passages, today's facts, question) and its sources."""

from __future__ import annotations

import datetime

from chat.prompt import source_json, user_turn_layout, user_turn_text
from retrieval.search import SearchHit


def hit(chunk_id: int, text: str, **fields) -> SearchHit:
    defaults = dict(
        score=0.5, document_id=3, document_title="handbook.md", collection_id=1,
        collection_name="HR", ordinal=0, page=None, char_start=0, char_end=len(text),
    )  # fmt: skip
    return SearchHit(chunk_id=chunk_id, text=text, **(defaults | fields))


TODAY = datetime.date(2026, 11, 29)


def test_passages_are_numbered_before_the_question_with_their_place_in_the_document():
    hits = [hit(7, "Thirty days.", heading_path=["Leave"]), hit(8, "Trains.", page=4)]
    text = user_turn_text("How long is leave?", hits, user_name="Alice", today=TODAY)
    assert text == (
        "Context passages from the team's documents:\n\n"
        "[1] handbook.md > Leave\nThirty days.\n\n"
        "[2] handbook.md (page 4)\nTrains.\n\n"
        "Today is Sunday, November 29, 2026. I am Alice.\n\n"
        "Question: How long is leave?"
    )


def test_a_passage_already_quoted_in_the_conversation_is_named_not_repeated():
    hits = [hit(7, "Thirty days.", heading_path=["Leave"]), hit(8, "Trains.")]
    text = user_turn_text("And travel?", hits, user_name="Alice", today=TODAY, quoted_earlier={7})
    assert "Thirty days." not in text and "Trains." in text
    assert "[1] handbook.md > Leave (quoted above)" in text
    assert source_json(1, hits[0], quoted_earlier=True)["quoted_earlier"] is True


def test_todays_facts_are_left_out_when_the_conversation_already_states_them():
    first = user_turn_text("Hi", [], user_name="Bob", today=TODAY)
    second = user_turn_text("And?", [], user_name="Bob", today=TODAY, known_facts=first)
    assert second == "And?"
    tomorrow = datetime.date(2026, 11, 30)
    third = user_turn_text("And?", [], user_name="Bob", today=tomorrow, known_facts=first)
    assert third.startswith("Today is Monday, November 30, 2026.")


def test_without_passages_the_turn_is_the_question_after_todays_facts():
    text = user_turn_text(" Hi ", [], user_name="Bob", today=TODAY)
    assert text == "Today is Sunday, November 29, 2026. I am Bob.\n\nHi"


def test_a_source_links_to_its_chunk_marked_in_the_document_page():
    source = source_json(2, hit(8, "Trains.", page=4, score=0.123456))
    assert source == {
        "n": 2,
        "chunk_id": 8,
        "document_id": 3,
        "document_title": "handbook.md",
        "collection": "HR",
        "page": 4,
        "heading_path": [],
        "snippet": "Trains.",
        "score": 0.1235,
        "url": "/documents/3/?chunk=8#chunk-8",
        "quoted_earlier": False,
    }


def test_the_layout_gives_the_character_range_of_each_passage_quoted_in_full():
    hits = [
        hit(7, "  Thirty days.  ", heading_path=["Leave"]),
        hit(8, "Trains."),
        hit(9, "Hotels."),
    ]
    text, spans = user_turn_layout(
        "How long is leave?", hits, user_name="Alice", today=TODAY, quoted_earlier={8}
    )
    assert text == user_turn_text(
        "How long is leave?", hits, user_name="Alice", today=TODAY, quoted_earlier={8}
    )
    assert [text[start:end] for start, end in spans] == ["Thirty days.", "Hotels."]
