"""BM25 over the inverted index in PostgreSQL (`retrieval.inverted_index`): one query a search.

The query reads the corpus totals (a few shard rows), the document frequency of each query
term, and the postings of those terms by their primary key (term, chunk); it sums each chunk's
BM25, keeps the chunks of ready documents in the allowed collections (a join on the small
documents table) and returns the best `limit` by ORDER BY ... LIMIT. Nothing is loaded into the
process, so every process and worker sees a document the moment its transaction commits.
The scores are bm25s's (see `retrieval.lexical_store`), to float rounding.

From PRUNE_FROM_CHUNKS chunks on, PRUNED_SQL is served: it skips what cannot change the answer
(MaxScore's bound: a term adds less than its weight); below, SEARCH_SQL, which reads every
posting of the terms. Both give the same chunks in the same order (`pruned=` forces one:
bench.lexical_store --query-paths times both).
"""

from __future__ import annotations

import logging

import numpy as np
from django.db import connection, transaction

from retrieval.lexical import K1, B
from retrieval.models import Chunk, Document
from retrieval.postings import chunk_terms, corpus_totals
from retrieval.unreachable_database import LexicalStoreUnavailable, reported_as

logger = logging.getLogger(__name__)

# NOTE: the shape is measured (bench.lexical_store, 100,000 chunks). The corpus totals and each
# term's weights are computed once (MATERIALIZED; inlined, PostgreSQL summed the shards and took
# the logarithm again for every posting row), in float8 throughout (a numeric constant made it
# numeric, slowly). Each term's postings are then read by a LATERAL index scan on (term), an
# index-only scan since the primary key carries the other columns (migration 0006), where a
# heap fetch per posting cost a page read each. Documents (status, collection) are joined once
# per scored chunk, after the sum. Each filter is a parameter that is either NULL (no filter) or
# an array, so one statement serves every case. Search passes collections; a list of chunk ids
# is only used when a caller has nothing else (it is as long as the collections are big).
SEARCH_SQL = """
WITH corpus AS MATERIALIZED (
    SELECT sum(num_chunks)::float8 AS n, sum(total_length)::float8 AS total
    FROM retrieval_corpusshard
),
weights AS MATERIALIZED (
    SELECT q.term,
           q.qtf * ln(1 + (c.n - s.df + 0.5) / (s.df + 0.5::float8)) AS idf,
           %(k1)s::float8 * (1 - %(b)s::float8) AS k_fixed,
           %(k1)s::float8 * %(b)s::float8 * c.n / c.total AS k_per_term
    FROM unnest(%(terms)s::text[], %(counts)s::float8[]) AS q(term, qtf)
    JOIN retrieval_termstats s ON s.term = q.term
    CROSS JOIN corpus c
    WHERE c.n > 0 AND c.total > 0
),
scores AS (
    SELECT p.chunk_id, p.document_id,
           sum(w.idf * p.tf / (p.tf + w.k_fixed + w.k_per_term * p.length)) AS score
    FROM weights w
    CROSS JOIN LATERAL (
        SELECT chunk_id, document_id, tf, length FROM retrieval_posting WHERE term = w.term
    ) p
    GROUP BY p.chunk_id, p.document_id
)
SELECT s.chunk_id, s.score
FROM scores s
JOIN retrieval_document d ON d.id = s.document_id
WHERE d.status = %(ready)s
  AND (%(collections)s::bigint[] IS NULL OR d.collection_id = ANY(%(collections)s::bigint[]))
  AND (%(chunks)s::bigint[] IS NULL OR s.chunk_id = ANY(%(chunks)s::bigint[]))
ORDER BY s.score DESC, s.chunk_id
LIMIT %(limit)s
"""

# The pruned search (MaxScore's idea, in one statement): the same top `limit` as SEARCH_SQL
# without scoring every chunk that holds a query term. A term adds less than its weight
# (qtf * idf) to any chunk's score (tf / (tf + k1 * (1 - b + b * length / avgdl)) < 1), so:
# 1. `threshold`: the chunks with the best scores over the rarest terms alone (their postings,
#    up to `budget` times the chunk count, the rarest term always), filtered as the answer is
#    (`probe`), scored in full by primary-key lookups of the other terms; the `limit`-th best
#    of those full scores, theta, is at most the answer's `limit`-th score.
# 2. `split`: the weakest terms whose weights add up to less than theta are skipped: a chunk
#    holding nothing else scores below theta and cannot be in the answer. The other terms'
#    postings are read and summed per chunk (`candidates`); a chunk whose sum plus the skipped
#    terms' total weight (`slack`) is below theta cannot be in the answer either.
# 3. `raised`: the best `probe` candidates, scored in full, raise theta; the candidates left
#    (`contenders`) add the skipped terms' postings (`rest`: looked up chunk by chunk, or read in
#    full and hashed where that is cheaper, `lookup_cost`).
# Thresholds are shaved by 1e-9 against float rounding. The skipped terms are added in term
# order, so chunks with the same postings tie exactly, as in SEARCH_SQL, broken by chunk id;
# scores differ from SEARCH_SQL's by float rounding only (the same terms added in another
# order). With theta 0 (fewer than `limit` chunks found by the rare terms) nothing is skipped.
PRUNED_SQL = """
WITH corpus AS MATERIALIZED (
    SELECT sum(num_chunks)::float8 AS n, sum(total_length)::float8 AS total
    FROM retrieval_corpusshard
),
weights AS MATERIALIZED (
    SELECT q.term, s.df, c.n,
           q.qtf * ln(1 + (c.n - s.df + 0.5) / (s.df + 0.5::float8)) AS idf,
           %(k1)s::float8 * (1 - %(b)s::float8) AS k_fixed,
           %(k1)s::float8 * %(b)s::float8 * c.n / c.total AS k_per_term
    FROM unnest(%(terms)s::text[], %(counts)s::float8[]) AS q(term, qtf)
    JOIN retrieval_termstats s ON s.term = q.term
    CROSS JOIN corpus c
    WHERE c.n > 0 AND c.total > 0
),
bounds AS MATERIALIZED (
    SELECT w.*,
           row_number() OVER (ORDER BY w.df, w.term) AS rarity,
           sum(w.df) OVER (ORDER BY w.df, w.term) AS rarer_postings,
           sum(w.idf) OVER (ORDER BY w.idf, w.term) AS weaker_weight
    FROM weights w
),
rare AS MATERIALIZED (
    SELECT p.chunk_id, p.document_id,
           sum(w.idf * p.tf / (p.tf + w.k_fixed + w.k_per_term * p.length)) AS score
    FROM bounds w
    CROSS JOIN LATERAL (
        SELECT chunk_id, document_id, tf, length FROM retrieval_posting WHERE term = w.term
    ) p
    WHERE w.rarity = 1 OR w.rarer_postings <= %(budget)s * w.n
    GROUP BY p.chunk_id, p.document_id
),
probe AS MATERIALIZED (
    SELECT r.chunk_id, r.score
    FROM rare r
    JOIN retrieval_document d ON d.id = r.document_id
    WHERE d.status = %(ready)s
      AND (%(collections)s::bigint[] IS NULL OR d.collection_id = ANY(%(collections)s::bigint[]))
      AND (%(chunks)s::bigint[] IS NULL OR r.chunk_id = ANY(%(chunks)s::bigint[]))
    ORDER BY r.score DESC, r.chunk_id
    LIMIT %(probe)s
),
threshold AS MATERIALIZED (
    SELECT CASE WHEN count(*) >= %(limit)s THEN min(score) * (1 - 1e-9) ELSE 0 END AS theta
    FROM (
        SELECT pr.score + coalesce(sum(
            w.idf * p.tf / (p.tf + w.k_fixed + w.k_per_term * p.length)
        ), 0) AS score
        FROM probe pr
        LEFT JOIN (
            SELECT * FROM bounds WHERE NOT (rarity = 1 OR rarer_postings <= %(budget)s * n)
        ) w ON true
        LEFT JOIN LATERAL (
            SELECT tf, length FROM retrieval_posting
            WHERE term = w.term AND chunk_id = pr.chunk_id
            LIMIT 1
        ) p ON true
        GROUP BY pr.chunk_id, pr.score
        ORDER BY score DESC
        LIMIT %(limit)s
    ) full_scores
),
split AS MATERIALIZED (
    SELECT b.*, b.weaker_weight < t.theta AS skipped
    FROM bounds b CROSS JOIN threshold t
    ORDER BY b.term
),
slack AS MATERIALIZED (
    SELECT coalesce(max(weaker_weight) FILTER (WHERE skipped), 0) AS weight FROM split
),
candidates AS MATERIALIZED (
    SELECT p.chunk_id, p.document_id,
           sum(w.idf * p.tf / (p.tf + w.k_fixed + w.k_per_term * p.length)) AS score
    FROM split w
    CROSS JOIN LATERAL (
        SELECT chunk_id, document_id, tf, length FROM retrieval_posting WHERE term = w.term
    ) p
    WHERE NOT w.skipped
    GROUP BY p.chunk_id, p.document_id
    HAVING sum(w.idf * p.tf / (p.tf + w.k_fixed + w.k_per_term * p.length))
           + (SELECT weight FROM slack) >= (SELECT theta FROM threshold)
),
eligible AS MATERIALIZED (
    SELECT c.chunk_id, c.score
    FROM candidates c
    JOIN retrieval_document d ON d.id = c.document_id
    WHERE d.status = %(ready)s
      AND (%(collections)s::bigint[] IS NULL OR d.collection_id = ANY(%(collections)s::bigint[]))
      AND (%(chunks)s::bigint[] IS NULL OR c.chunk_id = ANY(%(chunks)s::bigint[]))
),
leaders AS MATERIALIZED (
    SELECT e.chunk_id, e.score + coalesce(sum(
        w.idf * p.tf / (p.tf + w.k_fixed + w.k_per_term * p.length)
    ), 0) AS score
    FROM (SELECT * FROM eligible ORDER BY score DESC, chunk_id LIMIT %(probe)s) e
    LEFT JOIN (SELECT * FROM split WHERE skipped) w ON true
    LEFT JOIN LATERAL (
        SELECT tf, length FROM retrieval_posting
        WHERE term = w.term AND chunk_id = e.chunk_id
        LIMIT 1
    ) p ON true
    GROUP BY e.chunk_id, e.score
),
raised AS MATERIALIZED (
    SELECT greatest(
        (SELECT theta FROM threshold),
        CASE WHEN count(*) >= %(limit)s THEN min(score) * (1 - 1e-9) ELSE 0 END
    ) AS theta
    FROM (SELECT score FROM leaders ORDER BY score DESC LIMIT %(limit)s) best
),
contenders AS MATERIALIZED (
    SELECT e.chunk_id, e.score
    FROM eligible e
    WHERE e.score + (SELECT weight FROM slack) >= (SELECT theta FROM raised)
),
rest AS (
    SELECT p.chunk_id, w.term, w.idf * p.tf / (p.tf + w.k_fixed + w.k_per_term * p.length) AS score
    FROM split w
    CROSS JOIN LATERAL (
        SELECT chunk_id, tf, length FROM retrieval_posting WHERE term = w.term
    ) p
    WHERE w.skipped AND w.df <= %(lookup_cost)s * (SELECT count(*) FROM contenders)
      AND p.chunk_id IN (SELECT chunk_id FROM contenders)
    UNION ALL
    SELECT c.chunk_id, w.term, w.idf * p.tf / (p.tf + w.k_fixed + w.k_per_term * p.length)
    FROM split w
    CROSS JOIN contenders c
    CROSS JOIN LATERAL (
        SELECT tf, length FROM retrieval_posting
        WHERE term = w.term AND chunk_id = c.chunk_id
        LIMIT 1
    ) p
    WHERE w.skipped AND w.df > %(lookup_cost)s * (SELECT count(*) FROM contenders)
),
extra AS MATERIALIZED (
    SELECT chunk_id, sum(score ORDER BY term) AS score FROM rest GROUP BY chunk_id
)
SELECT c.chunk_id, c.score + coalesce(x.score, 0) AS score
FROM contenders c
LEFT JOIN extra x ON x.chunk_id = c.chunk_id
ORDER BY score DESC, c.chunk_id
LIMIT %(limit)s
"""


# The pruned search's knobs (bench.lexical_store --query-paths exhaustive,pruned at 100,000 and
# 300,000 chunks). The rarest terms' postings scored for the probe, as a share of the chunks;
PROBE_POSTINGS_SHARE = 0.01
# how many chunks are scored in full for theta (per 50 asked for);
PROBE_CHUNKS = 50
# a skipped term is read in full and hashed, rather than looked up chunk by chunk, below this
# many of its postings per contender (a lookup costs as much as reading ~20 postings in a scan).
LOOKUP_COST = 30
# NOTE: summing the postings per chunk is a hash table of every chunk a term of the query is in:
# half a million at 1,000,000 chunks. With PostgreSQL's default 4 MB (8 MB for hash tables) it
# spilled to disk in batches (p50 199 -> 170 ms exhaustive, p95 404 -> 294 ms pruned, at 64 MB);
# set for the search's own transaction only.
SEARCH_WORK_MEM = "32MB"
# Below this many chunks the exhaustive search is served: the pruned one's probe and extra
# steps cost more than it skips (100,000 chunks: p50 12.6 ms exhaustive, 14.8 ms pruned;
# 300,000: pruned 10-20% faster; 1,000,000: 30-45% faster).
PRUNE_FROM_CHUNKS = 200_000


class PostgresLexicalStore:
    name = "postgresql"

    def __init__(self, *, pruned: bool | None = None) -> None:
        """`pruned`: always (True) or never (False) the pruned search; None: by corpus size."""
        self.pruned = pruned
        num_indexed, _ = corpus_totals()
        missing = Chunk.objects.count() - num_indexed
        if missing > 0:
            logger.warning(
                "BM25 in PostgreSQL: %d chunks have no postings and are not found by keyword "
                "search; run manage.py backfill_postings",
                missing,
            )

    def search(
        self,
        query: str,
        limit: int,
        *,
        allowed_ids: np.ndarray | None = None,
        collection_ids: list[int] | None = None,
    ) -> list[tuple[int, float]]:
        counts = chunk_terms(query)
        if not counts or limit <= 0:
            return []
        if (collection_ids is not None and not collection_ids) or (
            allowed_ids is not None and not len(allowed_ids)
        ):
            return []
        chunk_ids = None
        if collection_ids is None and allowed_ids is not None:
            chunk_ids = [int(i) for i in allowed_ids]
        terms = sorted(counts)
        with (
            reported_as(LexicalStoreUnavailable, "keyword search"),
            transaction.atomic(),
            connection.cursor() as cursor,
        ):
            # One round trip: the search's own work_mem (SET LOCAL) and the corpus size.
            cursor.execute(
                "SELECT set_config('work_mem', %s, true),"
                " (SELECT coalesce(sum(num_chunks), 0) FROM retrieval_corpusshard)",
                [SEARCH_WORK_MEM],
            )
            num_chunks = int(cursor.fetchone()[1])
            pruned = self.pruned if self.pruned is not None else num_chunks >= PRUNE_FROM_CHUNKS
            cursor.execute(
                PRUNED_SQL if pruned else SEARCH_SQL,
                {
                    "terms": terms,
                    "counts": [float(counts[t]) for t in terms],
                    "k1": K1,
                    "b": B,
                    "ready": Document.Status.READY.value,
                    "collections": None if collection_ids is None else list(collection_ids),
                    "chunks": chunk_ids,
                    "limit": limit,
                    "budget": PROBE_POSTINGS_SHARE,
                    "probe": max(limit, PROBE_CHUNKS * limit // 50),
                    "lookup_cost": LOOKUP_COST,
                },
            )
            rows = cursor.fetchall()
        return [(int(chunk_id), float(score)) for chunk_id, score in rows if score > 0]

    def describe(self) -> str:
        num_indexed, _ = corpus_totals()
        missing = Chunk.objects.count() - num_indexed
        detail = f"postgresql inverted index ({num_indexed} chunks)"
        if missing > 0:  # an upgraded deployment, before its backfill
            detail += f"; {missing} chunks not indexed: run manage.py backfill_postings"
        return detail
