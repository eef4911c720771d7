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

Where oneDNN's quantized linear runs (`torch.ops.onednn.qlinear_*`, x86 builds), kept codes are
also packed into its blocked layout once (`Int8GemmWeight.packed_for_onednn`), as PyTorch's
inductor does for frozen int8 models: `torch._int_mm` reorders the weight on every call, which
on a 2-vCPU AMX Xeon made it slower than the packed bf16 GEMM; packed, on AMX's int8 tiles, the
1.5B's 512-token prefill steps ran 1.09x and its 32-sequence decode steps 1.22x as fast as on
packed bf16 copies (README, "Prefill weights: int8 codes on AMX"). With VNNI (no AMX) the
activations go in as uint8 codes + 128, the pairing its dot products take: there packed codes
ran the 1.5B's prefill steps 1.5x and its 32-sequence decodes 2.3x as fast as codes made per
step for `torch._int_mm` (README, "Prefill weights: int8 codes packed on VNNI").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import torch

from inference.engine.kernels import has_amx
from inference.engine.kernels import int8_gemm as native_int8_gemm

# NOTE: an input column is an outlier when its peak passes this many times the median column's
# peak; on SmolLM2's activations 6 set 0.1-1% of the columns aside (4: 0.5-2%, for less gain).
OUTLIER_RATIO = 6.0
# At most this share of the inputs goes through the float product: the largest columns.
MAX_OUTLIER_SHARE = 1 / 32
# The float product takes at least this many columns (zeros past the outliers).
MIN_OUTLIER_COLUMNS = 8
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
# The packed GEMM's sums must equal the plain integer GEMM's: both are exact int32 sums, so only
# the float scaling may differ (relative to the check's largest output).
PACKED_CHECK_TOLERANCE = 1e-5

logger = logging.getLogger(__name__)


def packed_int8_gemm_available() -> bool:
    """Whether this PyTorch build runs oneDNN's int8 linear on packed weights on this CPU."""
    onednn = getattr(torch.ops, "onednn", None)
    return (
        torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
        and onednn is not None
        and hasattr(onednn, "qlinear_prepack")
        and hasattr(onednn, "qlinear_pointwise")
    )


@dataclass(frozen=True, slots=True)
class Int8GemmWeight:
    """A weight [out, in] as int8 codes, one float32 scale per output row."""

    # int8 [out, in], either layout (row-major, or the transpose of a [in, out] tensor): the
    # GEMM reads W^T as fast either way
    codes: torch.Tensor
    scales: torch.Tensor  # float32 [out]
    # the codes in oneDNN's blocked layout (`packed_for_onednn`); None: `torch._int_mm` on codes
    packed: torch.Tensor | None = None
    # the packed GEMM's activations as uint8 codes + 128 (zero point 128), else int8 codes
    unsigned_activations: bool = False
    # whether steps may run the native coding and scaling passes (kernels/int8_gemm.py); False:
    # PyTorch's ops only (an engine configured without native kernels)
    native_passes: bool = True

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
        # NOTE: a packed tensor has no storage to measure; its blocks hold as many codes.
        num_copies = 1 if self.packed is None else 2
        return num_copies * self.codes.numel() * self.codes.element_size() + self.scales.numel() * 4

    def packed_for_onednn(self, *, unsigned_activations: bool | None = None) -> Int8GemmWeight:
        """This weight with its codes also in oneDNN's packed layout, where oneDNN's int8 linear
        runs and agrees with `torch._int_mm` on a check; else this weight as it is (logged).
        `unsigned_activations`: steps code their activations as uint8 + 128 for it; None: where
        the CPU has no AMX, whose tiles multiply int8 by int8 natively (VNNI's dot products take
        unsigned by signed bytes: on Zen 4 oneDNN ran int8 activations on a reference path, a
        [32, 1536] x [1536, 17920] product in 9.4 s against 2.7 ms as uint8).

        NOTE: the plain codes stay, as W^T [in, out] in memory: steps multiply their outlier
        columns' rows of W^T in float (`_matmul_rows`), which a row-major W gathered from every
        row (a quarter of a 32-sequence decode step of the 1.5B). Packed codes thus take twice
        the bytes of plain ones."""
        if self.packed is not None or not packed_int8_gemm_available():
            return self
        if unsigned_activations is None:
            unsigned_activations = not has_amx()
        in_features = self.codes.shape[1]
        try:
            packed = torch.ops.onednn.qlinear_prepack(self.codes.contiguous(), None)
            check = torch.arange(2 * in_features, dtype=torch.int64) % 255 - 127
            check = check.to(torch.int8).reshape(2, in_features)
            check_codes = _as_unsigned(check) if unsigned_activations else check
            got = _packed_product(check_codes, packed, self.scales, torch.float32)
        except RuntimeError as error:  # a build or CPU where oneDNN refuses: plain codes
            logger.warning("int8 codes stay unpacked: oneDNN could not pack them (%s)", error)
            return self
        expected = torch._int_mm(check, self.codes.t()).float() * self.scales
        peak = expected.abs().max().clamp_min(torch.finfo(torch.float32).tiny)
        if not ((got - expected).abs().max() / peak <= PACKED_CHECK_TOLERANCE):
            logger.warning("int8 codes stay unpacked: oneDNN's packed GEMM disagreed")
            return self
        codes_t = self.codes.t().contiguous()
        return replace(
            self, codes=codes_t.t(), packed=packed, unsigned_activations=unsigned_activations
        )

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
        max_outliers = int(MAX_OUTLIER_SHARE * x.shape[1])
        native = self.native_passes and native_int8_gemm.is_supported(x, self.codes.shape[0])
        unsigned = self.unsigned_activations  # set only with packed codes
        if native:  # the peaks, the outliers, the codes and the outliers' values in one call
            codes, token_scales, outliers, outlier_x = native_int8_gemm.code_tokens_outliers(
                x, OUTLIER_RATIO, max_outliers, unsigned=unsigned
            )
        else:
            magnitudes = x.abs()
            outliers = outlier_columns(magnitudes.amax(dim=0), max_outliers)
            codes, token_scales = _code_tokens(x, magnitudes, outliers)
            if unsigned:
                codes = _as_unsigned(codes)
        if self.packed is None:
            y = self._unpacked_product(codes, token_scales, x.dtype, native, out)
        else:
            # NOTE: the row scales applied by oneDNN, the token scales after, each product
            # rounded to x's dtype (twice where it is bf16: a float32 result took the 1.5B's
            # 512-token gate_up from ~4.5 to ~14 ms on an AMX Xeon, for less than the codes'
            # own error)
            y = _packed_product(codes, self.packed, self.scales, x.dtype)
            if native:  # the token scales and the outlier columns in one pass
                return native_int8_gemm.finish_rows(
                    y, token_scales, outlier_x, outliers, self.codes.t(), self.scales, out=out
                )
            y = y.mul_(token_scales.to(x.dtype))
            if out is not None:
                y = out.copy_(y)
        if outliers.numel():
            # NOTE: the native call gathered the outliers' values already
            values = outlier_x.to(x.dtype) if native else x.index_select(1, outliers)
            self._add_outlier_product(values, outliers, y)
        return y

    def _add_outlier_product(
        self, values: torch.Tensor, outliers: torch.Tensor, y: torch.Tensor
    ) -> None:
        """y += values [tokens, n] (x's `outliers` columns) @ those rows of W^T, in y's dtype.

        NOTE: the columns padded with zeros to a power of two: oneDNN compiles a GEMM for each
        new shape, and a count that changes every call recompiled it every call (a fifth of a
        32-sequence decode step of the 1.5B on an AMX Xeon went to its JIT)."""
        num_outliers = outliers.numel()
        num_padded = max(MIN_OUTLIER_COLUMNS, 1 << (num_outliers - 1).bit_length())
        if num_padded > num_outliers:  # zero values times column 0's weights add nothing
            outliers = torch.cat([outliers, outliers.new_zeros(num_padded - num_outliers)])
            values = torch.nn.functional.pad(values, (0, num_padded - num_outliers))
        # NOTE: rows of W^T: a few rows copied whatever the codes' layout (index_select on
        # the columns of a transposed view first copied all of it)
        weight_rows = self.codes.t().index_select(0, outliers).float() * self.scales
        y.addmm_(values, weight_rows.to(y.dtype))

    def _unpacked_product(
        self,
        codes: torch.Tensor,
        token_scales: torch.Tensor,
        dtype: torch.dtype,
        native: bool,
        out: torch.Tensor | None,
    ) -> torch.Tensor:
        """codes [tokens, in] @ W^T's codes by `torch._int_mm`, scaled back to `dtype`."""
        sums = torch._int_mm(codes, self.codes.t())
        if native:
            return native_int8_gemm.scale_sums(sums, token_scales, self.scales, dtype, out=out)
        y = sums.float().mul_(token_scales).mul_(self.scales).to(dtype)
        return y if out is None else out.copy_(y)


def outlier_columns(column_peaks: torch.Tensor, max_outliers: int) -> torch.Tensor:
    """The outlier columns of a step from `column_peaks` (each input column's largest |x| in
    it, in x's dtype): those past `OUTLIER_RATIO` times the median column's peak, at most
    `max_outliers` of them, the largest. PyTorch's ops; kernels/int8_gemm.py's
    `code_tokens_outliers` picks the same columns natively."""
    outliers = (column_peaks > OUTLIER_RATIO * column_peaks.median()).nonzero().squeeze(1)
    if outliers.numel() > max_outliers:
        outliers = column_peaks.topk(max_outliers).indices
    return outliers


def _packed_product(
    codes: torch.Tensor, packed: torch.Tensor, row_scales: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """codes [tokens, in] (int8, or uint8 codes + 128) @ the packed weight's codes, times
    `row_scales`, in `dtype`."""
    zero_points = torch.zeros(row_scales.shape, dtype=torch.int32)
    # NOTE: activations with scale 1: their per-token scales are the caller's to apply, which
    # oneDNN's per-tensor activation scale cannot express. int8 codes on AMX (as uint8 + 128,
    # a 32-token gate_up of the 1.5B ran faster alone, but the model's steps 1-2% slower with
    # the PyTorch pass that shifted them then); uint8 on VNNI (`packed_for_onednn`).
    activation_zero_point = 128 if codes.dtype == torch.uint8 else 0
    y: torch.Tensor = torch.ops.onednn.qlinear_pointwise(
        codes, 1.0, activation_zero_point, packed, row_scales, zero_points, None, 1.0, 0, dtype,
        "none", [], "",
    )  # fmt: skip
    return y


def _as_unsigned(codes: torch.Tensor) -> torch.Tensor:
    """int8 codes -> the codes + 128 as uint8 (the sign bit flipped)."""
    return codes.view(torch.uint8).bitwise_xor(0x80)


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
