"""The retrieval app's database migrations."""
