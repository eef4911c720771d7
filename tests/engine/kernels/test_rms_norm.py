"""The native add + RMSNorm against transformers' op-by-op bf16 RMSNorm."""

from __future__ import annotations

import pytest
import torch

from inference.engine.kernels import rms_norm as native_rms_norm
from inference.engine.layers.norm import RMSNorm
from inference.engine.model_runner import BatchEntry
from tests.engine.real_model import bfloat16_runner

needs_kernel = pytest.mark.skipif(
    not native_rms_norm.is_supported(
        torch.zeros(16, dtype=torch.bfloat16), torch.zeros(16).bfloat16()
    ),
    reason="the native kernel needs an x86-64 CPU with AVX-512 BF16 and a C compiler",
)


def op_by_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm.forward."""
    hidden = x.float()
    hidden = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + eps)
    return weight * hidden.to(x.dtype)


def random_rows(rows: int, hidden: int, seed: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, hidden, generator=generator) * 3).to(torch.bfloat16)
    residual = (torch.randn(rows, hidden, generator=generator) * 3).to(torch.bfloat16)
    weight = (torch.randn(hidden, generator=generator) * 0.5 + 1).to(torch.bfloat16)
    return x, residual, weight


@needs_kernel
@pytest.mark.parametrize(("rows", "hidden"), [(1, 576), (7, 64), (300, 576), (3, 4096)])
def test_native_norm_is_bitwise_the_op_by_op_norm(rows, hidden):
    x, _, weight = random_rows(rows, hidden, seed=rows)
    assert torch.equal(
        native_rms_norm.add_rms_norm(x, None, weight, 1e-5), op_by_op(x, weight, 1e-5)
    )


@needs_kernel
@pytest.mark.parametrize("rows", [1, 5, 256])
def test_with_a_residual_the_sum_is_stored_in_place_and_normalised(rows):
    x, residual, weight = random_rows(rows, 576, seed=rows)
    expected_sum = residual + x
    out = native_rms_norm.add_rms_norm(x, residual, weight, 1e-6)
    assert torch.equal(residual, expected_sum)  # updated in place, rounded to bf16
    assert torch.equal(out, op_by_op(expected_sum, weight, 1e-6))


def test_other_dtypes_and_odd_sizes_are_left_to_pytorch():
    assert not native_rms_norm.is_supported(torch.zeros(2, 576), torch.zeros(576))
    assert not native_rms_norm.is_supported(
        torch.zeros(2, 40, dtype=torch.bfloat16), torch.zeros(40, dtype=torch.bfloat16)
    )


@needs_kernel
def test_the_model_norm_gives_the_same_results_natively_and_op_by_op(monkeypatch):
    x, residual, _ = random_rows(4, 576, seed=3)
    norm = RMSNorm(576, 1e-5).to(torch.bfloat16)
    native_out, native_residual = norm(x, residual.clone())
    monkeypatch.setattr(native_rms_norm, "is_supported", lambda x, weight: False)
    torch_out, torch_residual = norm(x, residual.clone())
    assert torch.equal(native_out, torch_out) and torch.equal(native_residual, torch_residual)
    assert norm(x)[1] is None


@pytest.mark.slow
@needs_kernel
@pytest.mark.usefixtures("one_torch_thread")
def test_real_model_bf16_logits_with_the_native_norm_match_the_op_by_op_norm(
    chat_model_dir, real_tokenizer, monkeypatch
):
    prompt = real_tokenizer("The history of the printing press begins in")["input_ids"]
    runner = bfloat16_runner(chat_model_dir, kv_cache_mb=16, max_model_len=256)
    table = list(range(4))
    native_logits = runner.execute([BatchEntry(prompt, 0, table)])
    monkeypatch.setattr(native_rms_norm, "is_supported", lambda x, weight: False)
    torch_logits = runner.execute([BatchEntry(prompt, 0, table)])
    # NOTE: bitwise on this prompt when measured; a tolerance keeps a one-ulp flip in the
    # float32 sum order from failing the test, while a wrong norm would move logits by units.
    assert torch.allclose(native_logits, torch_logits, atol=0.05, rtol=0)
    assert native_logits.argmax() == torch_logits.argmax()
