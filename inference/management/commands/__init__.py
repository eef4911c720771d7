"""`manage.py prepare_models`: fetch, convert and load-check the chat and embedding models."""
