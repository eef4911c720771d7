"""Models of the retrieval app."""
