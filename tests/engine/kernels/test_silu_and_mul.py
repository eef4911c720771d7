"""The native silu(gate) * up against PyTorch's ops, bf16 and float32, at every instruction set
level the CPU has."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from inference.engine.kernels import silu_and_mul as native_silu_and_mul
from tests.engine.kernels.conftest import assert_same_values

pytestmark = pytest.mark.skipif(
    not native_silu_and_mul.is_supported(torch.zeros(1, 32, dtype=torch.bfloat16)),
    reason="the native kernel needs a CPU with AVX2, AVX-512 or NEON and a C compiler",
)


def pytorch_silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.split(gate_up.shape[-1] // 2, dim=-1)
    return F.silu(gate) * up


@pytest.mark.parametrize("rows", [1, 7, 16, 512])
def test_results_are_pytorchs(rows, isa_level, dtype):
    generator = torch.Generator().manual_seed(rows)
    gate_up = (torch.randn(rows, 3072, generator=generator) * 3).to(dtype)
    assert_same_values(native_silu_and_mul.silu_and_mul(gate_up), pytorch_silu_and_mul(gate_up))


def test_large_gates_saturate_like_pytorch(isa_level, dtype):
    gate = torch.tensor([-1e4, -200.0, -90.0, -20.0, 0.0, 20.0, 90.0, 1e4] * 2)
    gate_up = torch.cat((gate, torch.full((16,), 1.5))).to(dtype).unsqueeze(0)
    assert_same_values(native_silu_and_mul.silu_and_mul(gate_up), pytorch_silu_and_mul(gate_up))


def test_batched_and_non_contiguous_inputs_keep_their_leading_shape(isa_level, dtype):
    gate_up = torch.randn(64, 3, 2, dtype=dtype).permute(1, 2, 0)  # [3, 2, 64]
    out = native_silu_and_mul.silu_and_mul(gate_up)
    assert out.shape == (3, 2, 32)
    assert_same_values(out, pytorch_silu_and_mul(gate_up))


def test_other_dtypes_and_widths_are_left_to_pytorch():
    assert not native_silu_and_mul.is_supported(torch.zeros(1, 32, dtype=torch.float16))
    assert not native_silu_and_mul.is_supported(torch.zeros(1, 48, dtype=torch.bfloat16))
