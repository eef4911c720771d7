"""The retrieval app's management commands (in commands/)."""
