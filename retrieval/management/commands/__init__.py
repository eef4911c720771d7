"""`manage.py` commands: ingest, search, rebuild_index, eval_retrieval."""
