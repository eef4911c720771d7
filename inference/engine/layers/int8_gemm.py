"""Int8 GEMM weights: prefill-sized steps of quantized layers on the CPU's int8 dot products.

A quantized layer (a GGUF's int4 / int8 tensors) reads its packed weight at memory speed for
decodes, but a step of hundreds of tokens is compute-bound, and there its kernels (int4: ~250
GMAC/s on Zen 4) and the dequantize + bf16 GEMM path (~350) run well under what the CPU's int8
dot products allow (vpdpbusd: twice the multiply-adds of a bf16 FMA per cycle; oneDNN's int8
GEMM measured up to ~900 GMAC/s on two Zen 5 cores). `Int8GemmWeight` is a copy of the
layer's weight as int8 codes with one scale per output channel (rows); a step then codes its
activations per token and runs one integer GEMM (`torch._int_mm`), the int32 sums scaled back.

Activation outliers: a few input columns of some layers carry values tens of times the rest
(after RMSNorm's gains, and into `down_proj`). Coded per token, one such value sets the token's
scale and flattens every other code. Columns whose peak in the step passes `OUTLIER_RATIO` times
the median column's peak (at most `MAX_OUTLIER_SHARE` of them, the largest) are taken out of the
integer product and multiplied in float against their weight columns (the decomposition of
LLM.int8(), Dettmers et al. 2022, with a threshold relative to the step's own activations: their
scale differs by two orders of magnitude between models). On SmolLM2's real activations that
halved the layers' relative error (qkv 3.0% -> 1.1%) and SmolLM2's perplexity rise (4.7% ->
1.0%); the 1.5B's rose 0.16% (README, "Prefill weights: int8 codes").

The weight's own error: codes per row of an already-quantized weight (4-bit groups with their own
scales) round each value to 1/254 of its row's largest, ~1% of a typical weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inference.engine.kernels import int8_gemm as native_int8_gemm

# NOTE: an input column is an outlier when its peak passes this many times the median column's
# peak; on SmolLM2's activations 6 set 0.1-1% of the columns aside (4: 0.5-2%, for less gain).
OUTLIER_RATIO = 6.0
# At most this share of the inputs goes through the float product: the largest columns.
MAX_OUTLIER_SHARE = 1 / 32
# NOTE: tokens per integer GEMM. Scaling the int32 sums back once cost as much as the GEMM
# (a 768-token gate_up of the 1.5B in one GEMM: 62 ms against 41 in blocks of 128, Zen 5),
# hence blocks; since the sums are scaled natively into the result (scale_sums out=), larger
# blocks win: 4 of the 1.5B's layers (16 matmuls with their codes made per step) on a
# 512-token step took 420 / 399 / 354 ms in blocks of 128 / 256 / 512 (Zen 4, interleaved
# medians of 7), and its 32-stream load's 512-token steps 3.6-3.9 s against 3.36 s.
ROWS_PER_GEMM = 512
INT8_MAX = 127
# NOTE: a row of zeros (padding rows are) gets this peak: small enough for any real row, large
# enough that the reciprocal of its scale stays finite (the codes are then 0, not 0 x inf).
MIN_ROW_PEAK = 1e-30  # csrc/int8_row_codes.h: MIN_ROW_PEAK


@dataclass(frozen=True, slots=True)
class Int8GemmWeight:
    """A weight [out, in] as int8 codes, one float32 scale per output row."""

    # int8 [out, in], either layout (row-major, or the transpose of a [in, out] tensor): the
    # GEMM reads W^T as fast either way
    codes: torch.Tensor
    scales: torch.Tensor  # float32 [out]

    @classmethod
    def from_rows(cls, weight: torch.Tensor) -> Int8GemmWeight:
        """Codes for `weight` [out, in] (any float dtype): symmetric, per row."""
        weight = weight.float()
        scales = weight.abs().amax(dim=1).clamp_min(MIN_ROW_PEAK) / INT8_MAX
        # NOTE: times the reciprocal, as the native coding (csrc/int8_row_codes.h) does
        codes = torch.round(weight * scales.reciprocal()[:, None]).to(torch.int8)
        return cls(codes.contiguous(), scales)

    @property
    def nbytes(self) -> int:
        return self.codes.numel() * self.codes.element_size() + self.scales.numel() * 4

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [tokens, in] @ W^T in x's dtype: activations coded per token (row), outlier columns
        multiplied in x's dtype, `ROWS_PER_GEMM` tokens at a time."""
        if x.shape[0] == 0:  # NOTE: no column peaks to take: the empty product
            return x.new_empty(0, self.codes.shape[0])
        if x.shape[0] <= ROWS_PER_GEMM:
            return self._matmul_rows(x)
        y = x.new_empty(x.shape[0], self.codes.shape[0])
        for start in range(0, x.shape[0], ROWS_PER_GEMM):
            # NOTE: each block written in place: copying it in after cost the 1.5B's 512-token
            # gate_up ~9 of its ~47 ms (float32, a Xeon without BF16)
            end = start + ROWS_PER_GEMM
            self._matmul_rows(x[start:end], out=y[start:end])
        return y

    def _matmul_rows(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """`matmul` of at most `ROWS_PER_GEMM` tokens, into `out` (rows of a contiguous
        result) where given."""
        magnitudes = x.abs()
        column_peaks = magnitudes.amax(dim=0)
        outliers = (column_peaks > OUTLIER_RATIO * column_peaks.median()).nonzero().squeeze(1)
        max_outliers = int(MAX_OUTLIER_SHARE * x.shape[1])
        if outliers.numel() > max_outliers:
            outliers = column_peaks.topk(max_outliers).indices
        native = native_int8_gemm.is_supported(x, self.codes.shape[0])
        if native:
            skip = torch.zeros(x.shape[1], dtype=torch.uint8)
            skip[outliers] = 1
            codes, token_scales = native_int8_gemm.code_tokens(x, skip)
        else:
            codes, token_scales = _code_tokens(x, magnitudes, outliers)
        sums = torch._int_mm(codes, self.codes.t())
        if native:
            y = native_int8_gemm.scale_sums(sums, token_scales, self.scales, x.dtype, out=out)
        else:
            y = sums.float().mul_(token_scales).mul_(self.scales).to(x.dtype)
            if out is not None:
                y = out.copy_(y)
        if outliers.numel():
            # NOTE: rows of W^T: a few rows copied whatever the codes' layout (index_select on
            # the columns of a transposed view first copied all of it)
            weight_rows = self.codes.t().index_select(0, outliers).float() * self.scales
            y.addmm_(x.index_select(1, outliers), weight_rows.to(x.dtype))
        return y


def _code_tokens(
    x: torch.Tensor, magnitudes: torch.Tensor, outliers: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 codes [tokens, in], float32 scales [tokens, 1]) of x with the `outliers` columns
    left out, in PyTorch ops (kernels/int8_gemm.py does the same in one pass)."""
    if outliers.numel():
        x = x.index_fill(1, outliers, 0)
        magnitudes = magnitudes.index_fill(1, outliers, 0)
    token_scales = magnitudes.amax(dim=1, keepdim=True).float()
    token_scales = token_scales.clamp_min(torch.finfo(torch.float32).tiny) / INT8_MAX
    return torch.round(x.float() / token_scales).to(torch.int8), token_scales
