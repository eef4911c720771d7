"""Torch-free bookkeeping: sequences, KV blocks, scheduling, speculation, detokenizing."""
