"""The inference app's management commands (in commands/)."""
