"""One module per model architecture (llama.py: Llama, Mistral, Qwen2, SmolLM2)."""
