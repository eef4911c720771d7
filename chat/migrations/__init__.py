"""The chat app's database migrations."""
