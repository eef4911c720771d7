"""Remote OpenAI-compatible inference backends (vLLM and the like): clients, health, routing."""
