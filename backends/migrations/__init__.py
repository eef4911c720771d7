"""The backends app's database migrations."""
