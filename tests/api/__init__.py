"""Tests of api/: the /v1 REST API, its keys, rate limits and OpenAI compatibility."""
