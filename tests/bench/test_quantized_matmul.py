"""bench.quantized_matmul: its smoke run times the three ways on real kernels."""

from __future__ import annotations

import json

import pytest

from bench.quantized_matmul import SMOKE_TOKENS, WAYS, format_table, main
from inference.engine.kernels import int4_linear


@pytest.mark.skipif(not int4_linear.is_supported(256, 128), reason="no native kernels here")
def test_the_smoke_run_times_each_way_for_each_quantization_and_token_count(capsys) -> None:
    assert main(["--smoke", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)

    rows = report["results"]
    assert [(row["quantization"], row["tokens"]) for row in rows] == [
        (method, tokens) for method in ("int4", "int8") for tokens in SMOKE_TOKENS
    ]
    for row in rows:
        macs = row["tokens"] * row["shape"][0] * row["shape"][1]
        for way in WAYS:
            assert row[f"{way}_ms"] > 0
            # GMAC/s is the same time seen the other way (both rounded)
            assert row[f"{way}_gmac_s"] == pytest.approx(
                macs / row[f"{way}_ms"] / 1e6, rel=0.05, abs=0.1
            )
    table = format_table(report)
    assert report["config"]["kernel_isa"] in table
    assert table.count("| int4 | o [256, 256] | ") == len(SMOKE_TOKENS)
