"""Tests of inference/engine/core/: sequences, blocks, scheduling, speculation, detokenizing."""
