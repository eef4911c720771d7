"""The documents of `bench.ingestion_workers`: real passages as Markdown uploads, and what
ingestion makes of them (their chunk counts; the time of each stage, measured here).

Passages come from SQuAD-dev (../shared/eval/squad-dev, where present) and then the Debian
Reference sets in eval/, in file order, `passages_per_document` consecutive ones a document,
with a heading wherever the article changes.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CORPORA = (
    ROOT.parent / "shared" / "eval" / "squad-dev",
    ROOT / "eval" / "debian-reference-cross",
    ROOT / "eval" / "debian-reference-zh",
)


@dataclass(frozen=True, slots=True)
class Upload:
    name: str
    data: bytes


def make_uploads(num_documents: int, passages_per_document: int) -> list[Upload]:
    """Markdown documents of consecutive real passages; raises ValueError if there are too few."""
    passages: list[tuple[str, str]] = []
    for corpus in CORPORA:
        if (corpus / "corpus.jsonl").is_file():
            with (corpus / "corpus.jsonl").open(encoding="utf-8") as lines:
                for line in lines:
                    row = json.loads(line)
                    passages.append((row.get("title", ""), row["text"]))
    needed = num_documents * passages_per_document
    if len(passages) < needed:
        raise ValueError(f"{needed} passages asked for; the corpora hold {len(passages)}")
    uploads = []
    for index in range(num_documents):
        start = index * passages_per_document
        blocks: list[str] = []
        title = None
        for passage_title, text in passages[start : start + passages_per_document]:
            if passage_title and passage_title != title:
                title = passage_title
                blocks.append(f"# {title.replace('_', ' ')}")
            blocks.append(text)
        uploads.append(Upload(f"passages-{index:04d}.md", "\n\n".join(blocks).encode()))
    return uploads


def expected_chunks(upload: Upload, tokenizer: Any) -> int:
    """How many chunks ingestion must make of `upload`: its own extract and chunk steps."""
    from django.conf import settings

    from retrieval.chunking import chunk_sections
    from retrieval.extract import extract

    drafts = chunk_sections(
        extract(upload.data, upload.name),
        tokenizer,
        settings.CACHET_CHUNK_TOKENS,
        settings.CACHET_CHUNK_OVERLAP,
    )
    return len(drafts)


def time_stages(uploads: list[Upload], num_threads: int) -> dict[str, float]:
    """Seconds of each ingestion stage summed over `uploads`, ingested one by one in this
    process on `num_threads` torch threads: `prepare` (read, extract, chunk), `embed`, `store`
    (chunks, postings and pgvector's vectors in one transaction), as `retrieval.ingest` runs
    them. Needs an empty set of tables of its own (the caller's)."""
    import torch
    from django.core.files.base import ContentFile
    from django.db import transaction

    from retrieval.ingest import embed, prepare, store
    from retrieval.models import Collection, Document
    from retrieval.search import get_retriever

    torch.set_num_threads(num_threads)
    retriever = get_retriever()
    collection = Collection.objects.create(name="ingestion stages")
    seconds = {"prepare": 0.0, "embed": 0.0, "store": 0.0}
    for upload in uploads:
        document = Document.objects.create(
            collection=collection, title=upload.name, file=ContentFile(upload.data, upload.name)
        )
        began = time.perf_counter()
        prepared = prepare(document, retriever)
        prepared_at = time.perf_counter()
        vectors = embed(retriever, [draft.text for draft in prepared.drafts])
        embedded_at = time.perf_counter()
        with transaction.atomic():
            old_ids, new_ids = store(prepared)
            retriever.vectors.replace(old_ids, new_ids, vectors)
        stored_at = time.perf_counter()
        seconds["prepare"] += prepared_at - began
        seconds["embed"] += embedded_at - prepared_at
        seconds["store"] += stored_at - embedded_at
    return seconds
