"""Tests of retrieval/: extraction, chunking, embeddings, indexes, search, ingestion, recovery."""
