"""Torch modules and PyTorch paths: paged attention, linear variants, quantization."""
