"""Both RMSNorm flavours against transformers' own modules, bitwise."""

from __future__ import annotations

import pytest
import torch

from inference.engine.layers.norm import GemmaRMSNorm, RMSNorm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_matches_transformers_bitwise(dtype):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(0)
    # NOTE: the PyTorch path; the native kernel sums in another order and has its own tests
    # against this module (tests/engine/kernels/test_rms_norm.py).
    ours = RMSNorm(64, eps=1e-5, native_kernels=False)
    theirs = LlamaRMSNorm(64, eps=1e-5)
    with torch.no_grad():
        theirs.weight.normal_(1.0, 0.1)
        ours.weight.copy_(theirs.weight)
    ours, theirs = ours.to(dtype), theirs.to(dtype)
    x = (torch.randn(7, 64) * 3).to(dtype)
    residual = (torch.randn(7, 64) * 3).to(dtype)
    with torch.no_grad():
        assert torch.equal(ours(x)[0], theirs(x))
        # with the residual stream: the add transformers' decoder layer does before its norm
        normed, stream = ours(x, residual.clone())
        assert torch.equal(stream, residual + x)
        assert torch.equal(normed, theirs(residual + x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemma_rms_norm_matches_transformers_bitwise_over_rows_and_heads(dtype):
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

    torch.manual_seed(0)
    ours, theirs = GemmaRMSNorm(32, eps=1e-6), Gemma3RMSNorm(32, eps=1e-6)
    with torch.no_grad():
        theirs.weight.normal_(0.0, 0.5)
        ours.weight.copy_(theirs.weight)
    ours, theirs = ours.to(dtype), theirs.to(dtype)
    rows = (torch.randn(7, 32) * 3).to(dtype)
    heads = (torch.randn(5, 4, 32) * 3).to(dtype)  # [tokens, heads, head_dim]: a q/k norm
    with torch.no_grad():
        assert torch.equal(ours(rows), theirs(rows))
        assert torch.equal(ours(heads), theirs(heads))
