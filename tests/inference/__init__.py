"""Tests of inference/ outside the engine: model configuration, runtime, prompts, model files."""
