"""The calls of the native quantized kernels (int4_linear.c, int8_linear.c): x times a weight
the kernel holds in its own layout, checked before the kernel reads anything, and the weight's
rows dequantized from that layout, or coded as int8 rows for the integer GEMM."""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

# This thread's buffer for codes made for one step (`int8_codes_packed_transposed(scratch=True)`)
_step_codes = threading.local()


class WeightMatmul:
    """x [M, K] (contiguous, of `dtype`) times a packed weight -> [M, out_features] of `dtype`.

    The kernel and the weight's pointers are resolved once: a decode step makes ~120 of these
    calls, and per-call lookups were a measurable share of their Python cost. The kernels share
    one signature: (x, *weight pointers, out, m, n, padded n, k, *extra sizes, num_threads).
    """

    def __init__(
        self,
        kernel: Callable[..., int],
        weights: tuple[torch.Tensor, ...],
        *,
        name: str,
        in_features: int,
        out_features: int,
        padded_out_features: int,
        dtype: torch.dtype,
        extra_sizes: tuple[int, ...] = (),
    ) -> None:
        self._weights = weights  # keep the pointers below alive
        self._pointers = tuple(weight.data_ptr() for weight in weights)
        self._kernel, self._extra_sizes = kernel, extra_sizes
        self.name, self.dtype = name, dtype
        self.in_features, self.out_features = in_features, out_features
        self.padded_out_features = padded_out_features

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        num_tokens, in_features = x.shape
        if in_features != self.in_features or x.dtype != self.dtype:
            raise ValueError(
                f"input of {in_features} features in {x.dtype} for an {self.name} "
                f"[{self.out_features}, {self.in_features}] weight serving {self.dtype}"
            )
        out = torch.empty(num_tokens, self.out_features, dtype=self.dtype)
        status = self._kernel(
            x.data_ptr(),
            *self._pointers,
            out.data_ptr(),
            num_tokens,
            self.out_features,
            self.padded_out_features,
            in_features,
            *self._extra_sizes,
            torch.get_num_threads(),
        )
        if status != 0:
            raise RuntimeError(
                f"{self.name} kernel refused x {list(x.shape)} for a [{self.out_features}, "
                f"{self.in_features}] weight (status {status})"
            )
        return out


def dequantize_packed_transposed(
    kernel: Callable[..., int],
    weights: tuple[torch.Tensor, ...],
    *,
    name: str,
    start: int,
    end: int,
    in_features: int,
    dtype: torch.dtype,
    extra_sizes: tuple[int, ...] = (),
) -> torch.Tensor:
    """Rows [start, end) of a packed weight (`start` a multiple of 64) as W^T [in_features,
    end - start] of `dtype`. The kernels share one signature: (*weight pointers, out, first row,
    number of rows, padded rows, k, *extra sizes, num_threads)."""
    out = torch.empty(in_features, end - start, dtype=dtype)
    rows = (start, end, in_features)
    _run_on_rows(kernel, weights, (out,), f"{name}_dequantize", *rows, extra_sizes)
    return out


def int8_codes_packed_transposed(
    kernel: Callable[..., int],
    weights: tuple[torch.Tensor, ...],
    *,
    name: str,
    start: int,
    end: int,
    in_features: int,
    extra_sizes: tuple[int, ...] = (),
    scratch: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows [start, end) of a packed weight (`start` a multiple of 64) as int8 codes W^T
    [in_features, end - start] and float32 scales [end - start], one per row
    (csrc/int8_row_codes.h). The kernels share one signature: (*weight pointers, codes out,
    scales out, first row, number of rows, padded rows, k, *extra sizes, num_threads).

    `scratch`: the codes are written into this thread's buffer, which the next such call
    overwrites (codes made for one layer's step). NOTE: a fresh tensor for each of a step's
    layers (27.5 MB for the 1.5B's gate_up) cost its page faults every time."""
    num_codes = in_features * (end - start)
    if scratch:
        buffer = getattr(_step_codes, "buffer", None)
        if buffer is None or buffer.numel() < num_codes:
            buffer = _step_codes.buffer = torch.empty(num_codes, dtype=torch.int8)
        codes_t = buffer[:num_codes].view(in_features, end - start)
    else:
        codes_t = torch.empty(in_features, end - start, dtype=torch.int8)
    scales = torch.empty(end - start, dtype=torch.float32)
    rows = (start, end, in_features)
    _run_on_rows(kernel, weights, (codes_t, scales), f"{name}_int8_codes", *rows, extra_sizes)
    return codes_t, scales


def _run_on_rows(
    kernel: Callable[..., int],
    weights: tuple[torch.Tensor, ...],
    outputs: tuple[torch.Tensor, ...],
    kernel_name: str,
    start: int,
    end: int,
    in_features: int,
    extra_sizes: tuple[int, ...],
) -> None:
    """Calls a kernel of the row kernels' signature: (*weight pointers, *output pointers, first
    row, number of rows, padded rows, k, *extra sizes, num_threads); raises if it refuses."""
    status = kernel(
        *(tensor.data_ptr() for tensor in weights + outputs),
        start,
        end - start,
        weights[0].shape[0],
        in_features,
        *extra_sizes,
        torch.get_num_threads(),
    )
    if status != 0:
        raise RuntimeError(f"{kernel_name} refused rows [{start}, {end}) (status {status})")
