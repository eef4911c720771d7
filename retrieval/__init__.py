"""The retrieval app: documents, their extraction and chunking, embeddings, the indexes, search."""
