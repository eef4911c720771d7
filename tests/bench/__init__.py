"""Tests of the benchmark commands (bench/), run at `--smoke` size."""
