"""The postings' primary key carries their other columns, so a search reads only the index.

A search reads every posting of its terms. Read through the heap, each posting cost a page
(they are stored in ingestion order, a term's postings scattered over the table): 55,000
postings read 50,000 pages at 100,000 chunks. With `INCLUDE (document_id, tf, length)` the
same postings are an index-only scan over a few hundred contiguous pages (bench.lexical_store:
p50 109 -> 40 ms there). PostgreSQL only; Django's state is unchanged (the key's columns are).
"""

from django.db import migrations

PLAIN = "PRIMARY KEY (term, chunk_id)"
COVERING = "PRIMARY KEY (term, chunk_id) INCLUDE (document_id, tf, length)"


def key(definition: str):
    def change(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(
                "ALTER TABLE retrieval_posting DROP CONSTRAINT retrieval_posting_pkey,"
                f" ADD CONSTRAINT retrieval_posting_pkey {definition}"
            )

    return change


class Migration(migrations.Migration):
    dependencies = [
        ("retrieval", "0005_termstats_without_pattern_index"),
    ]

    operations = [migrations.RunPython(key(COVERING), key(PLAIN))]
