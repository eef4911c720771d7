"""Golden questions from rated answers (the admin's "Add to golden set" on answer feedback).

A thumbs-up answer becomes the expected answer as it was given (staff may edit it); a thumbs-down
one leaves the expected answer empty for staff to write, so a wrong answer never becomes the
reference. The expected chunks are the passages the answer cited ("[n]"), or all it was given
when it cites none; their documents are kept too, for when the chunks are gone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction

from chat.models import AnswerFeedback, question_of
from evals.models import GoldenQuestion
from retrieval.models import Chunk, Document

CITATION = re.compile(r"\[(\d+)\]")


@dataclass(slots=True)
class GoldenSetAdded:
    created: list[GoldenQuestion] = field(default_factory=list)
    num_already: int = 0  # feedback already in the golden set
    num_without_question: int = 0  # an answer whose question is gone

    @property
    def num_needing_answer(self) -> int:
        return sum(1 for golden in self.created if not golden.expected_answer)


def cited_sources(answer_text: str, sources: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The sources the answer cites by number; all of them when it cites none."""
    cited = {int(number) for number in CITATION.findall(answer_text)}
    chosen = [source for source in sources if source.get("n") in cited]
    return chosen or list(sources)


@transaction.atomic
def add_to_golden_set(feedback: Iterable[AnswerFeedback], user: User | None) -> GoldenSetAdded:
    added = GoldenSetAdded()
    for item in feedback:
        if GoldenQuestion.objects.filter(feedback=item).exists():
            added.num_already += 1
            continue
        answer = item.message
        asked = question_of(answer)
        if asked is None:
            added.num_without_question += 1
            continue
        sources = cited_sources(answer.content, answer.sources or [])
        chunk_ids = [s["chunk_id"] for s in sources if isinstance(s.get("chunk_id"), int)]
        chunks = list(Chunk.objects.filter(pk__in=chunk_ids))
        document_ids = {s["document_id"] for s in sources if isinstance(s.get("document_id"), int)}
        golden = GoldenQuestion.objects.create(
            question=asked.content,
            expected_answer=answer.content if item.rating == AnswerFeedback.Rating.UP else "",
            feedback=item,
            created_by=user,
        )
        golden.expected_chunks.set(chunks)
        document_ids |= {chunk.document_id for chunk in chunks}
        golden.expected_documents.set(Document.objects.filter(pk__in=document_ids))
        golden.collections.set(answer.conversation.collections.all())
        added.created.append(golden)
    return added
