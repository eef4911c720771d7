"""The retrieval app: documents, chunks, the vector index and search."""
