"""bench.prefill_attention: its smoke run times both ways through paged_attention, in bf16
where the kernel serves it and in float32."""

from __future__ import annotations

import json

import pytest
import torch

from bench.prefill_attention import SMOKE_CHUNKS, SMOKE_SHAPES, attention_calls, format_table, main
from inference.engine.kernels import paged_prefill_attention
from tests.engine.kernels.test_paged_prefill_attention import close


@pytest.fixture(params=[torch.bfloat16, torch.float32], ids=["bf16", "float32"])
def dtype(request) -> torch.dtype:
    if not paged_prefill_attention.is_supported(request.param, torch.device("cpu"), 9, 3, 64):
        pytest.skip(f"the native prefill kernel does not serve {request.param} on this CPU")
    return request.param


def test_both_ways_compute_the_same_attention(dtype) -> None:
    # A benchmark that timed two different computations would compare nothing.
    [shape], [chunk] = SMOKE_SHAPES.values(), SMOKE_CHUNKS
    calls = attention_calls(shape, chunk, dtype)
    kernel, pytorch = calls["kernel"](), calls["pytorch"]()
    assert kernel.dtype == pytorch.dtype == dtype
    assert close(kernel, pytorch)


def test_the_smoke_run_times_each_way_and_reports_the_speedup(capsys, dtype) -> None:
    name = str(dtype).removeprefix("torch.")
    assert main(["--smoke", "--json", "--dtype", name]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["config"]["dtype"] == name
    [row] = report["results"]
    assert (row["cached"], row["queries"]) == (SMOKE_CHUNKS[0].num_cached, 24)
    for way in ("kernel", "pytorch"):
        assert row[f"{way}_ms"] > 0 and row[f"{way}_gflop_s"] > 0
    # the ratio of the reported times, to the 2 decimals it is given in (a loaded machine can
    # make it small, where 1% would be finer than its rounding)
    assert row["speedup"] == pytest.approx(row["pytorch_ms"] / row["kernel_ms"], abs=0.005)
    assert "prompts" not in report
    table = format_table(report)
    assert "| smollm2-135m (9, 3, 64) | new turn | 40 + 24 |" in table
