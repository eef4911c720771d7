"""Tests of inference/engine/layers/: attention, linear variants, quantization."""
