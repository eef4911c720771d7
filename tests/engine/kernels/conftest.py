"""Fixtures of the native kernels' tests: every instruction set level this CPU can run, and
both activation types, so a machine tests its own level and the ones below it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from inference.engine.kernels import ISA_ENVIRONMENT_VARIABLE, supported_isa_levels

LEVELS = [level.name for level in supported_isa_levels()]


@pytest.fixture(params=LEVELS or [None])
def isa_level(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The kernels built for each level this CPU can run ($CACHET_KERNEL_ISA forces it)."""
    if request.param is None:
        pytest.skip("this CPU has none of the kernels' instruction sets")
    monkeypatch.setenv(ISA_ENVIRONMENT_VARIABLE, request.param)
    yield request.param


@pytest.fixture(params=[torch.bfloat16, torch.float32], ids=["bf16", "float32"])
def dtype(request: pytest.FixtureRequest) -> torch.dtype:
    """The activation types the kernels are built for."""
    return request.param


def assert_same_values(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """bf16: bit for bit (the kernels round where PyTorch rounds). float32: to a few ulps (the
    kernels' exp and their float32 sums may take another order than PyTorch's)."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    if actual.dtype == torch.bfloat16:
        assert torch.equal(actual, expected)
    else:
        torch.testing.assert_close(actual, expected, rtol=4e-6, atol=1e-6)


def assert_each_row_is_computed_alone(layer: torch.nn.Module, x: torch.Tensor) -> None:
    """The quantized kernels share weight loads among the tokens of a step: token t's output must
    still be bit for bit the one it gets in a step of its own (batching never changes an answer)."""
    together = layer.kernel_matmul(x)
    alone = torch.cat([layer.kernel_matmul(row[None]) for row in x])
    assert torch.equal(together, alone)
