"""The tables of BM25 kept in the database: postings, indexed chunks, term and corpus statistics.

They are written in the same transaction as the chunks (`retrieval.postings`), on PostgreSQL
only; on SQLite they exist but stay empty (the in-process bm25s store serves there). Scoring
needs, per query term, its document frequency and its postings, and the corpus's chunk count
and total length (`retrieval.lexical_postgres`):

- `Posting` (term, chunk, tf) carries the chunk's length and document too, so a query reads
  the postings of its terms by the primary key and joins nothing but the (small) documents
  table for the collection and status filter.
- `TermStats` holds each term's document frequency, changed by per-document deltas.
- `CorpusShard` holds the chunk count and total length in a few rows that ingestions add their
  deltas to by document id: two workers storing documents at once rarely wait on the same row,
  and a query sums the few rows instead of counting a million chunks.
- `IndexedChunk` records each indexed chunk's length (a chunk without terms counts in N as
  bm25s counts it), so removing a chunk subtracts exactly what indexing it added.
"""

from __future__ import annotations

from django.db import models

# Rows of CorpusShard: enough that concurrent ingestions seldom share one.
NUM_CORPUS_SHARDS = 16


class IndexedChunk(models.Model):
    # NOTE: DO_NOTHING with the (deferred) foreign key: a chunk deleted without going through
    # retrieval.postings would leave the statistics wrong, so such a commit fails instead.
    chunk = models.OneToOneField(
        "retrieval.Chunk", on_delete=models.DO_NOTHING, primary_key=True, related_name="+"
    )
    length = models.PositiveIntegerField()


class Posting(models.Model):
    pk = models.CompositePrimaryKey("term", "chunk")
    term = models.TextField()
    chunk = models.ForeignKey("retrieval.Chunk", on_delete=models.DO_NOTHING, related_name="+")
    document_id = models.BigIntegerField()
    tf = models.PositiveIntegerField()
    length = models.PositiveIntegerField()


class TermStats(models.Model):
    term = models.TextField(primary_key=True)
    df = models.BigIntegerField()


class CorpusShard(models.Model):
    shard = models.PositiveSmallIntegerField(primary_key=True)
    num_chunks = models.BigIntegerField(default=0)
    total_length = models.BigIntegerField(default=0)
