"""Benchmarks (not shipped): python -m bench.engine [--table] | chat | api | retrieval (--smoke)."""
