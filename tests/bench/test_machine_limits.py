"""bench.machine_limits: the limit arithmetic on known numbers, the measurements at tiny sizes."""

from __future__ import annotations

import pytest
import torch

from bench.machine_limits import (
    MachineLimits,
    ModelShape,
    compute_limit_tok_s,
    decode_limit_tok_s,
    level_limits,
    measure_machine_limits,
    shares_of,
)

# 100M parameters in the layers, a 50M-parameter logits head, 100 MB read per decode step.
SHAPE = ModelShape(
    non_embedding_params=100_000_000, lm_head_params=50_000_000, weight_bytes_per_token=10**8
)
MACHINE = MachineLimits(
    threads=2, read_gb_s=20.0, bf16_gflop_s=400.0, fp32_gflop_s=150.0, int8_gop_s=800.0
)


def test_the_decode_limit_is_bandwidth_over_the_bytes_read_per_token() -> None:
    assert decode_limit_tok_s(20.0, SHAPE) == pytest.approx(200.0)


def test_the_compute_limit_counts_prompt_and_output_tokens_and_the_head_for_outputs() -> None:
    # 256 new prompt + 64 output tokens through the layers: 2 * 100M * 320 = 64 GFLOP, and the
    # head for the 64 outputs: 2 * 50M * 64 = 6.4 GFLOP; 64 tokens per 70.4 GFLOP at 100 GFLOP/s.
    limit = compute_limit_tok_s(100.0, SHAPE, new_prompt_tokens=256, output_tokens=64)
    assert limit == pytest.approx(100e9 * 64 / 70.4e9)
    # Cached prompt tokens cost nothing: fewer new tokens, a higher limit.
    assert compute_limit_tok_s(100.0, SHAPE, 0, 64) > limit


def test_one_stream_is_bound_by_bandwidth_and_many_by_compute() -> None:
    def at(concurrency: int) -> dict:
        return level_limits(
            MACHINE,
            SHAPE,
            dtype="bfloat16",
            concurrency=concurrency,
            new_prompt_tokens=256,
            output_tokens=64,
        )

    one, many = at(1), at(32)
    assert one["decode_limit_tok_s"] == many["decode_limit_tok_s"] == pytest.approx(200.0)
    assert one["bandwidth_limit_tok_s"] == pytest.approx(200.0)
    assert many["bandwidth_limit_tok_s"] == pytest.approx(32 * 200.0)
    compute_int8 = 800e9 * 64 / 70.4e9  # the faster of the bf16 and int8 peaks
    assert one["compute_limit_int8_tok_s"] == pytest.approx(compute_int8)
    assert one["compute_limit_bf16_tok_s"] == pytest.approx(400e9 * 64 / 70.4e9)
    assert one["compute_limit_fp32_tok_s"] == pytest.approx(150e9 * 64 / 70.4e9)
    assert (one["bound"], one["limit_tok_s"]) == ("bandwidth", pytest.approx(200.0))
    assert (many["bound"], many["limit_tok_s"]) == ("compute", pytest.approx(compute_int8))


def test_without_int8_the_compute_side_takes_the_engine_dtypes_peak() -> None:
    machine = MachineLimits(
        threads=2, read_gb_s=20.0, bf16_gflop_s=400.0, fp32_gflop_s=150.0, int8_gop_s=None
    )
    for dtype, peak in (("bfloat16", 400.0), ("float32", 150.0)):
        found = level_limits(
            machine, SHAPE, dtype=dtype, concurrency=64, new_prompt_tokens=256, output_tokens=64
        )
        assert found["compute_limit_int8_tok_s"] is None
        assert found["limit_tok_s"] == pytest.approx(peak * 1e9 * 64 / 70.4e9)


def test_shares_are_the_throughput_over_each_limit() -> None:
    found = level_limits(
        MACHINE, SHAPE, dtype="bfloat16", concurrency=1, new_prompt_tokens=256, output_tokens=64
    )
    shares = shares_of(50.0, found)
    assert shares["share_of_limit"] == pytest.approx(0.25)
    assert shares["share_of_bandwidth_limit"] == pytest.approx(0.25)
    assert shares["share_of_compute_bf16"] == pytest.approx(
        50.0 / found["compute_limit_bf16_tok_s"]
    )
    assert all(value is None for value in shares_of(None, found).values())
    found["compute_limit_int8_tok_s"] = None
    assert shares_of(50.0, found)["share_of_compute_int8"] is None


def test_the_measurements_run_at_the_given_thread_count_and_restore_it() -> None:
    before = torch.get_num_threads()
    limits = measure_machine_limits(1, read_bytes=2**20, gemm_shape=(64, 64, 64), repeats=1)
    assert torch.get_num_threads() == before
    assert limits.threads == 1
    assert limits.read_gb_s > 0 and limits.bf16_gflop_s > 0 and limits.fp32_gflop_s > 0
    assert limits.int8_gop_s is None or limits.int8_gop_s > 0
    assert limits.float_gflop_s("float32") == limits.fp32_gflop_s
    assert limits.float_gflop_s("bfloat16") == limits.bf16_gflop_s
    assert set(limits.to_json()) == {
        "threads", "read_gb_s", "bf16_gflop_s", "fp32_gflop_s", "int8_gop_s",
    }  # fmt: skip
