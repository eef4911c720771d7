"""The frontend app's database migrations."""
