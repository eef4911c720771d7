"""Tests of inference/engine/models/: each architecture against transformers."""
