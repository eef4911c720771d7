"""The /v1 REST API (django-ninja): OpenAI-compatible chat, completions, embeddings; documents."""
