"""bench.prefill_attention: its smoke run times both ways through paged_attention."""

from __future__ import annotations

import json

import pytest
import torch

from bench.prefill_attention import SMOKE_CHUNKS, SMOKE_SHAPES, attention_calls, format_table, main
from inference.engine.kernels import paged_prefill_attention

pytestmark = pytest.mark.skipif(
    not paged_prefill_attention.is_supported(torch.bfloat16, torch.device("cpu"), 9, 3, 64),
    reason="the native prefill kernel does not run on this CPU",
)


def test_both_ways_compute_the_same_attention() -> None:
    # A benchmark that timed two different computations would compare nothing.
    [shape], [chunk] = SMOKE_SHAPES.values(), SMOKE_CHUNKS
    calls = attention_calls(shape, chunk)
    kernel, pytorch = calls["kernel"]().float(), calls["pytorch"]().float()
    assert torch.allclose(kernel, pytorch, atol=4e-3, rtol=2**-6)


def test_the_smoke_run_times_each_way_and_reports_the_speedup(capsys) -> None:
    assert main(["--smoke", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    [row] = report["results"]
    assert (row["cached"], row["queries"]) == (SMOKE_CHUNKS[0].num_cached, 24)
    for way in ("kernel", "pytorch"):
        assert row[f"{way}_ms"] > 0 and row[f"{way}_gflop_s"] > 0
    assert row["speedup"] == pytest.approx(row["pytorch_ms"] / row["kernel_ms"], rel=0.01)
    assert "prompts" not in report
    table = format_table(report)
    assert "| smollm2-135m (9, 3, 64) | new turn | 40 + 24 |" in table
