"""The backends app's management commands (in commands/)."""
