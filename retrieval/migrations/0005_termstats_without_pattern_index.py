"""Drop the text_pattern_ops index Django adds beside a text primary key on PostgreSQL.

TermStats is only ever looked up by equality (its primary key serves that), while each
ingestion upserts hundreds of its rows: a second index on the term only doubled that write.
SQLite never had it.
"""

from django.db import migrations

INDEX = "retrieval_termstats_term_6613b6d1_like"


def drop_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX IF EXISTS {INDEX}")


def create_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            f"CREATE INDEX IF NOT EXISTS {INDEX} ON retrieval_termstats (term text_pattern_ops)"
        )


class Migration(migrations.Migration):
    dependencies = [
        ("retrieval", "0004_lexical_postings"),
    ]

    operations = [migrations.RunPython(drop_index, create_index)]
