"""bench.serving_sweep at smoke sizes: SmolLM2 via the API at 1 and 2 streams, and its limits."""

from __future__ import annotations

import json

import pytest

from bench import serving_sweep as bench

pytestmark = pytest.mark.real_weights


def test_a_smoke_sweep_measures_each_level_and_its_share_of_the_machines_limits(
    chat_model_dir,
) -> None:
    report = bench.run_sweep(smoke=True, models_dir=chat_model_dir.parent)
    json.dumps(report)
    machine, config = report["machine"], report["config"]
    assert config["concurrency"] == [1, 2] and config["max_tokens"] == 4 and config["smoke"]
    assert machine["threads"] >= 1
    assert machine["read_gb_s"] > 0 and machine["bf16_gflop_s"] > 0 and machine["fp32_gflop_s"] > 0

    (model,) = report["models"]
    assert model["requested"] == "smollm2-135m-instruct" and model["model"]
    shape = model["shape"]
    # SmolLM2-135M: 30 layers of width 576, a tied 49,152-token table; quantized weights read
    # per token are fewer bytes than the parameters in bf16 would be.
    assert (shape["num_layers"], shape["hidden_size"], shape["vocab_size"]) == (30, 576, 49152)
    assert shape["lm_head_params"] == 49152 * 576
    assert 0 < shape["non_embedding_params"] < 135_000_000
    assert 0 < shape["weight_bytes_per_token"] <= shape["weight_bytes"]
    assert shape["weight_bytes_per_token"] < 2 * (shape["non_embedding_params"] + 49152 * 576)

    assert [level["concurrency"] for level in model["levels"]] == [1, 2]
    for level in model["levels"]:
        assert level["errors"] == 0, level["error_details"]
        assert level["answered"] == level["concurrency"]
        # ignore_eos: every stream produces all its tokens.
        assert level["completion_tokens"] == 4 * level["concurrency"]
        assert level["finish_reasons"] == {"length": level["concurrency"]}
        assert level["cached_tokens_mean"] > 0  # the warm-up cached the system prompt
        assert 0 < level["ttft_p50_s"] <= level["ttft_p95_s"]
        limits = level["limits"]
        assert limits["bound"] in {"bandwidth", "compute"}
        assert limits["bandwidth_limit_tok_s"] == pytest.approx(
            level["concurrency"] * limits["decode_limit_tok_s"], rel=1e-3
        )
        assert limits["limit_tok_s"] <= limits["bandwidth_limit_tok_s"]
        assert 0 < level["share_of_limit"] <= 1
        assert 0 < level["share_of_bandwidth_limit"] <= 1
        assert level["share_of_compute_bf16"] > 0
        if model["dtype"] == "bfloat16":  # NOTE: served in float32, bf16's peak bounds nothing
            assert level["share_of_compute_bf16"] <= 1
    # The warm-up and the 1 + 2 streams, all on one server.
    assert model["server_engine"]["requests"] == 4
    table = bench.format_report(report)
    assert "smollm2-135m-instruct" in table and "share" in table
    assert bench.num_errors(report) == 0


def test_concurrency_levels_are_read_from_a_comma_separated_list() -> None:
    import argparse

    assert bench.parse_levels("1,8,32") == (1, 8, 32)
    for bad in ("1,x", "0,8", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            bench.parse_levels(bad)
