"""One module per architecture (llama.py: Llama, Mistral, Qwen2, Qwen3; gemma3.py), the interface
they share (causal_lm.py) and the registry by model_type (registry.py)."""
