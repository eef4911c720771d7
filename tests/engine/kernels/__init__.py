"""Tests of inference/engine/kernels/: the build, and each kernel against its PyTorch path."""
