"""The frontend app's management commands (in commands/)."""
