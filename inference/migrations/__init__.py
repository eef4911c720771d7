"""The inference app's database migrations."""
