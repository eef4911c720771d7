"""The api app's database migrations."""
