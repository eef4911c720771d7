"""The api app's management commands (in commands/)."""
