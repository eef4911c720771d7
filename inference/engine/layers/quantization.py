"""Weight-only quantization as a module swap after loading: int8 per channel, int4 per group.

`quantize_model(model, "int8" | "int4", group_size)` replaces every `nn.Linear` of the decoder
(the fused `qkv_proj` and `gate_up_proj`, `o_proj`, `down_proj`, an untied `lm_head`) and the
token embedding with quantized modules, and drops the float weights. A tied embedding is
quantized once, row-wise: the same int8 table serves the token lookup (rows dequantized on the
fly) and the logits matmul. The memory targets count every weight and a 49,152 x 576 embedding
is a fifth of SmolLM2-135M, so leaving it in bf16 would keep int8 above 55% of bf16.

NOTE: the embedding / lm_head stay int8 under "int4" too. Measured on SmolLM2-135M against bf16
(teacher-forced next-token top-1 agreement over 2,048 tokens of tests/data's text): int4 layers
with an int8 table 0.963, everything int4 0.850 (logits KL 0.004 vs 0.067). The price is
memory: 34.0% of bf16 with the native kernel's int4 format (35.2% in PyTorch's) instead of
~31% for this model (the table is 21% of its weights; less for larger models).

- int8: symmetric, one scale per output channel (row), codes in [-127, 127].
- int4: asymmetric per group of `group_size` input columns. In the native kernel's format
  where it runs (kernels/int4_linear.py: a bf16 scale and a uint8 zero point, fitted by least
  squares), else min/max groups in the layout of `torch._weight_int4pack_mm_for_cpu`:
  w = (q - 8) * scale + zero. The default group of 32 matches the Q4_1 blocks of the bundled
  GGUF model, whose weights it then reproduces almost exactly (the scales are rounded to the
  model dtype).

Layers can also be built from weights already quantized (a GGUF checkpoint's, loaded tensor by
tensor by gguf_checkpoint.py): `Int4Linear.from_codes` keeps a file's 4-bit codes and maps its
scales onto either format, `Int8Linear.from_codes` takes rows quantized a chunk at a time
(`quantize_rows_int8`).

Kernels: bf16 int4 layers on CPUs with AVX-512 VNNI and BF16 store their codes in the layout
of the native kernel (kernels/int4_linear.py) and run it up to `int4_linear.MAX_TOKENS`
tokens a step: ~2.5x PyTorch's int4 kernel at one token. Otherwise, on CPU, a step of at most
`PACKED_KERNEL_MAX_TOKENS` tokens (decodes, logits of a few sequences) runs PyTorch's
weight-only kernels (`_weight_int8pack_mm`, `_weight_int4pack_mm_for_cpu`, which take bf16,
fp16 and fp32 activations), reading half (int8) or a quarter (int4) of the bf16 bytes. Larger
batches (prefill) dequantize the weight in row chunks and use the dense GEMM: the packed kernels
grow about linearly with the number of tokens and lose to bf16 GEMM from ~16 tokens
(measured: [3072, 576] weight at 16 tokens, 0.37 ms int8 kernel vs 0.21 ms bf16). Off CPU (CUDA)
the dequantizing path is the only one.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import replace
from typing import TypeVar

import torch
from torch import nn

from inference.engine.kernels import int4_linear as native_int4
from inference.engine.kernels import int8_linear as native_int8
from inference.engine.kernels.int4_linear import MAX_TOKENS as NATIVE_INT4_MAX_TOKENS
from inference.engine.kernels.int4_linear import (
    int4_matmul,
    pack_int4_vnni,
    quantize_int4_vnni,
    unpack_int4_vnni,
    unpack_int4_vnni_rows,
)
from inference.engine.kernels.int8_linear import MAX_TOKENS as NATIVE_INT8_MAX_TOKENS
from inference.engine.kernels.int8_linear import int8_matmul
from inference.engine.kernels.weight_matmul import WeightMatmul
from inference.engine.layers.dense_gemm import DenseGemmWeight
from inference.engine.layers.int8_gemm import Int8GemmWeight

logger = logging.getLogger(__name__)

# "auto": a checkpoint's own precision (a GGUF's tensor types, gguf_checkpoint.py); a float
# checkpoint has none, so for it (and for quantize_model) "auto" is "none".
QUANTIZATION_METHODS = ("auto", "none", "int8", "int4")
INT4_GROUP_SIZES = (32, 64, 128, 256)  # what _weight_int4pack_mm_for_cpu accepts
DEFAULT_INT4_GROUP_SIZE = 32
TABLE_METHOD = "int8"  # the embedding and lm_head, whatever the method (see the NOTE above)
PACKED_KERNEL_MAX_TOKENS = 8
KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# Rows of int4 weight interleaved by the CPU kernel's packing (see `pack_int4`).
INT4_ROW_BLOCK = 64
# NOTE: dequantized chunks of ~4 MB in bf16: large enough for an efficient GEMM, small enough
# that a 49,152-row logits matrix is never materialised in full precision.
DEQUANT_CHUNK_ELEMENTS = 2 * 1024 * 1024


def check_quantization(method: str, group_size: int) -> None:
    """ValueError naming the accepted values when `method` or `group_size` is not usable."""
    if method not in QUANTIZATION_METHODS:
        raise ValueError(
            f"quantization {method!r} is not supported; use one of {list(QUANTIZATION_METHODS)}"
        )
    if isinstance(group_size, bool) or not isinstance(group_size, int):
        raise ValueError(f"quantization_group_size must be an integer, got {group_size!r}")
    if method == "int4" and group_size not in INT4_GROUP_SIZES:
        raise ValueError(
            f"quantization_group_size {group_size} is not supported for int4; "
            f"use one of {list(INT4_GROUP_SIZES)}"
        )


class QuantizedLinear(nn.Module):
    """A weight-only quantized `nn.Linear`: y = x @ dequantize(W).T + b, in x's dtype."""

    in_features: int
    out_features: int
    bias: torch.Tensor | None
    max_kernel_tokens: int = PACKED_KERNEL_MAX_TOKENS
    dtype: torch.dtype  # the model's
    # the native kernel's call, where the layer keeps its weight in that kernel's layout
    _native_matmul: WeightMatmul | None = None
    # the weight in the model dtype, kept for steps above the kernel's token limit
    # (`keep_dense_weight`); None: those steps dequantize the weight every time.
    dense_weight: DenseGemmWeight | None = None
    # int8 codes of the weight for the same steps, run as an integer GEMM: kept
    # (`keep_int8_gemm_weight`), or made for each of those steps (`make_int8_codes_per_step`)
    int8_gemm_weight: Int8GemmWeight | None = None
    codes_int8_gemm_weight_per_step: bool = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # NOTE: the decode fast path of native layers first: one check, then the kernel.
        if (
            self._native_matmul is not None
            and x.dim() == 2
            and x.shape[0] <= self.max_kernel_tokens
            and x.dtype == self.dtype
            and x.is_contiguous()
            and x.device.type == "cpu"
        ):
            y = self._native_matmul(x)
            return y if self.bias is None else y.add_(self.bias)
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        if x.shape[0] <= self.max_kernel_tokens and self.can_use_kernel(x):
            y = self.kernel_matmul(x)
        else:
            y = self.dequantized_matmul(x)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)

    def keep_dense_weight(self, max_kernel_tokens: int) -> int:
        """Keep W^T dense (the model dtype) for steps of more than `max_kernel_tokens` tokens
        (the kernel's limit drops to it); the bytes the copy takes.

        NOTE: such a step then runs one dense GEMM instead of unpacking every weight first
        (in oneDNN's packed layout where it runs: layers/dense_gemm.py); decodes and small
        batches still read the quantized weight (measured in the README, "Prefill weights")."""
        weight_t = torch.empty(self.in_features, self.out_features, dtype=self.dtype)
        for start, end in self._row_chunks():
            weight_t[:, start:end] = self.dequantize_rows_transposed(start, end, self.dtype)
        self.dense_weight = DenseGemmWeight.from_transposed(weight_t)
        self.max_kernel_tokens = min(self.max_kernel_tokens, max_kernel_tokens)
        return self.dense_weight.nbytes

    def keep_int8_gemm_weight(
        self, max_kernel_tokens: int, *, packed: bool = False, native_passes: bool = True
    ) -> int:
        """Keep the weight as int8 codes per row for steps of more than `max_kernel_tokens`
        tokens, which then run one integer GEMM (layers/int8_gemm.py); the bytes the copy takes.
        `packed`: also in oneDNN's packed layout where it runs
        (`Int8GemmWeight.packed_for_onednn`). `native_passes`: see `Int8GemmWeight`."""
        self.int8_gemm_weight = replace(self.make_int8_gemm_weight(), native_passes=native_passes)
        if packed:
            self.int8_gemm_weight = self.int8_gemm_weight.packed_for_onednn()
        self.max_kernel_tokens = min(self.max_kernel_tokens, max_kernel_tokens)
        return self.int8_gemm_weight.nbytes

    @property
    def makes_int8_codes_natively(self) -> bool:
        """Whether the native format's kernel makes the int8 codes (`make_int8_gemm_weight`)."""
        # NOTE: a call for no rows: whether that kernel runs here, for this layer
        return self.native_int8_codes_transposed(num_rows=0) is not None

    def make_int8_codes_per_step(self, max_kernel_tokens: int) -> None:
        """Run steps of more than `max_kernel_tokens` tokens as one integer GEMM on int8 codes
        made for that step and let go after it (needs `makes_int8_codes_natively`).

        NOTE: the native kernel makes them in ~5 ms for the 1.5B's [17920, 1536] gate_up
        against ~45 ms for its 512-token integer GEMM (Zen 4, csrc/int8_row_codes.h), where
        keeping them takes a byte a weight (1.44 GiB for the 1.5B)."""
        if not self.makes_int8_codes_natively:
            raise ValueError(f"{type(self).__name__} has no native kernel to make int8 codes")
        self.codes_int8_gemm_weight_per_step = True
        self.max_kernel_tokens = min(self.max_kernel_tokens, max_kernel_tokens)

    def make_int8_gemm_weight(self, *, for_one_step: bool = False) -> Int8GemmWeight:
        """The weight as int8 codes per row (`Int8GemmWeight.from_rows` of its float32 rows): by
        the native format's kernel where it runs, else with PyTorch ops a chunk of rows at a
        time. `for_one_step`: the native codes go to a buffer the next layer's codes overwrite."""
        native = self.native_int8_codes_transposed(self.out_features, scratch=for_one_step)
        if native is not None:
            codes_t, scales = native
            return Int8GemmWeight(codes_t.t(), scales)
        codes = torch.empty(self.out_features, self.in_features, dtype=torch.int8)
        scales = torch.empty(self.out_features, dtype=torch.float32)
        for start, end in self._row_chunks():
            rows = Int8GemmWeight.from_rows(self.dequantize_rows(start, end, torch.float32))
            codes[start:end], scales[start:end] = rows.codes, rows.scales
        return Int8GemmWeight(codes, scales)

    def native_int8_codes_transposed(
        self, num_rows: int, *, scratch: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(int8 codes W^T [in, num_rows], float32 scales [num_rows]) of the first `num_rows`
        rows as `make_int8_gemm_weight` codes them, by a native kernel, or None where none
        runs. `scratch`: into this thread's buffer for one step's codes."""
        return None

    def _row_chunks(self) -> list[tuple[int, int]]:
        """Row ranges to dequantize at a time (multiples of the int4 row block)."""
        rows = max(INT4_ROW_BLOCK, DEQUANT_CHUNK_ELEMENTS // self.in_features)
        rows -= rows % INT4_ROW_BLOCK
        return [
            (start, min(start + rows, self.out_features))
            for start in range(0, self.out_features, rows)
        ]

    def dequantized_matmul(self, x: torch.Tensor) -> torch.Tensor:
        """The plain PyTorch path: dequantize row chunks of W and run the dense GEMM (or the GEMM
        alone on the dense copy, `keep_dense_weight`, or the integer GEMM on int8 codes kept,
        `keep_int8_gemm_weight`, or made now, `make_int8_codes_per_step`)."""
        dense = self.dense_weight
        if dense is not None and dense.dtype == x.dtype and dense.device == x.device:
            return dense.matmul(x)
        gemm_weight = self.int8_gemm_weight
        if gemm_weight is None and self.codes_int8_gemm_weight_per_step and x.device.type == "cpu":
            gemm_weight = self.make_int8_gemm_weight(for_one_step=True)
        if gemm_weight is not None and x.device.type == "cpu":
            return gemm_weight.matmul(x)
        chunks = self._row_chunks()
        if len(chunks) == 1:
            return torch.matmul(x, self.dequantize_rows_transposed(0, self.out_features, x.dtype))
        out = x.new_empty(x.shape[0], self.out_features)
        for start, end in chunks:
            weight_t = self.dequantize_rows_transposed(start, end, x.dtype)
            torch.matmul(x, weight_t, out=out[:, start:end])
        return out

    def dequantize_rows_transposed(self, start: int, end: int, dtype: torch.dtype) -> torch.Tensor:
        """W^T [in, end - start] for rows [start, end) (`start` a multiple of 64), any layout:
        unpacked by the native format's kernel where it runs (the same values; with PyTorch ops
        unpacking a large layer cost as much as the GEMM that follows), else transposed rows."""
        weight_t = self.native_dequantize_transposed(start, end, dtype)
        return self.dequantize_rows(start, end, dtype).T if weight_t is None else weight_t

    def native_dequantize_transposed(
        self, start: int, end: int, dtype: torch.dtype
    ) -> torch.Tensor | None:
        """`dequantize_rows_transposed` by a native kernel, or None where none runs."""
        return None

    def can_use_kernel(self, x: torch.Tensor) -> bool:
        return x.device.type == "cpu" and x.dtype in KERNEL_DTYPES

    def kernel_matmul(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def dequantize_rows(self, start: int, end: int, dtype: torch.dtype) -> torch.Tensor:
        """Rows [start, end) of the weight in `dtype`."""
        raise NotImplementedError

    def dequantize_row_ids(self, row_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The weight rows `row_ids` (any shape) in `dtype`: an embedding lookup."""
        raise NotImplementedError

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


def quantize_rows_int8(rows: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes int8 [rows, K], scales [rows] in `dtype`) of float weight rows: symmetric, one scale
    per row. Row by row, so a large matrix can be quantized a chunk of rows at a time."""
    w = rows.float()
    # NOTE: the scale is rounded to the model dtype before the codes are computed, so the
    # codes are the best ones for the scale the kernel will really use.
    scales = (w.abs().amax(dim=1) / 127).clamp(min=1e-12).to(dtype)
    codes = torch.round(w / scales.float()[:, None]).clamp(-127, 127).to(torch.int8)
    return codes, scales


class Int8Linear(QuantizedLinear):
    """int8 codes with one scale per output row (w = s q). Where the native int8 kernel runs
    (kernels/int8_linear.py), the codes are kept in its tiled layout (padded to 64 rows) and
    steps of up to `max_kernel_tokens` tokens run it; otherwise they are row-major for PyTorch's
    `_weight_int8pack_mm`."""

    weight_int8: torch.Tensor  # int8 [out, in] (PyTorch) or [padded out, in] (native layout)
    scales: torch.Tensor  # [out] or [padded out], one per output row, in the model dtype

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        *,
        dtype: torch.dtype | None = None,
        native_kernels: bool = True,
    ) -> None:
        """`weight` quantized per row, its scales in `dtype` (the model's; default: weight's)."""
        dtype = dtype or weight.dtype
        codes, scales = quantize_rows_int8(weight, dtype)
        super().__init__()
        self._store(codes, scales, bias, native_kernels)

    @classmethod
    def from_codes(
        cls,
        codes: torch.Tensor,
        scales: torch.Tensor,
        bias: torch.Tensor | None,
        *,
        native_kernels: bool = True,
    ) -> Int8Linear:
        """A layer of already quantized rows (`quantize_rows_int8`, e.g. a chunk at a time);
        the scales' dtype is the model's."""
        layer = cls.__new__(cls)
        QuantizedLinear.__init__(layer)
        layer._store(codes, scales, bias, native_kernels)
        return layer

    def _store(
        self,
        codes: torch.Tensor,
        scales: torch.Tensor,
        bias: torch.Tensor | None,
        native_kernels: bool,
    ) -> None:
        self.out_features, self.in_features = codes.shape
        self.dtype = scales.dtype
        self.is_native = native_kernels and native_int8.is_supported(
            self.in_features, scales.dtype, codes.device
        )
        self._native_matmul = None
        self.register_buffer("bias", bias)
        if not self.is_native:
            self.register_buffer("weight_int8", codes.contiguous())
            self.register_buffer("scales", scales.contiguous())
            return
        padded_scales = scales.new_zeros(native_int8.padded_rows(self.out_features))
        padded_scales[: self.out_features] = scales
        self.register_buffer("weight_int8", native_int8.pack_int8(codes))
        self.register_buffer("scales", padded_scales)
        self.max_kernel_tokens = NATIVE_INT8_MAX_TOKENS
        self._native_matmul = int8_matmul(
            self.weight_int8, self.scales, self.out_features, self.dtype
        )

    def can_use_kernel(self, x: torch.Tensor) -> bool:
        if self.is_native:
            return x.device.type == "cpu" and x.dtype == self.dtype
        return super().can_use_kernel(x)

    def kernel_matmul(self, x: torch.Tensor) -> torch.Tensor:
        if self._native_matmul is not None:
            return self._native_matmul(x.contiguous())
        return torch._weight_int8pack_mm(x, self.weight_int8, self.scales.to(x.dtype))

    def dequantize_rows(self, start: int, end: int, dtype: torch.dtype) -> torch.Tensor:
        if self.is_native:
            codes = native_int8.unpack_int8_rows(self.weight_int8, start, end).to(dtype)
        else:
            codes = self.weight_int8[start:end].to(dtype)
        return codes.mul_(self.scales[start:end, None].to(dtype))

    def native_dequantize_transposed(
        self, start: int, end: int, dtype: torch.dtype
    ) -> torch.Tensor | None:
        if not self.is_native or self.weight_int8.device.type != "cpu":
            return None
        return native_int8.dequantize_transposed(self.weight_int8, self.scales, start, end, dtype)

    def native_int8_codes_transposed(
        self, num_rows: int, *, scratch: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        if not self.is_native or self.weight_int8.device.type != "cpu":
            return None
        return native_int8.int8_codes_transposed(
            self.weight_int8, self.scales, 0, num_rows, self.dtype, scratch=scratch
        )

    def dequantize_row_ids(self, row_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if self.is_native:
            flat_ids = row_ids.reshape(-1)
            codes = native_int8.unpack_int8_row_ids(self.weight_int8, flat_ids)
            codes = codes.view(*row_ids.shape, self.in_features).to(dtype)
        else:
            codes = self.weight_int8[row_ids].to(dtype)
        return codes.mul_(self.scales[row_ids].to(dtype).unsqueeze(-1))


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K // 2] from int4 codes [N, K] (N a multiple of 64), in the layout that
    `torch._convert_weight_to_int4pack_for_cpu` produces (torch 2.13): each block of 64 rows is
    stored as [K, 32] bytes whose byte (k, j) holds row j (low nibble) and row j + 32 (high)."""
    num_rows, num_cols = codes.shape
    blocks = codes.to(torch.uint8).view(
        num_rows // INT4_ROW_BLOCK, 2, INT4_ROW_BLOCK // 2, num_cols
    )
    packed = blocks[:, 0] | (blocks[:, 1] << 4)  # [blocks, 32, K]
    return packed.transpose(1, 2).contiguous().view(num_rows, num_cols // 2)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of `pack_int4`: uint8 codes [N, K]."""
    num_rows, half_cols = packed.shape
    blocks = packed.view(num_rows // INT4_ROW_BLOCK, 2 * half_cols, INT4_ROW_BLOCK // 2)
    blocks = blocks.transpose(1, 2)  # [blocks, 32, K]
    return torch.cat((blocks & 15, blocks >> 4), dim=1).reshape(num_rows, 2 * half_cols)


@functools.cache
def _torch_int4_layout_matches() -> bool:
    """Whether this torch's CPU int4 packing is `pack_int4`'s layout (checked once)."""
    pack = getattr(torch, "_convert_weight_to_int4pack_for_cpu", None)
    if pack is None or not hasattr(torch, "_weight_int4pack_mm_for_cpu"):
        return False
    generator = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (2 * INT4_ROW_BLOCK, 64), dtype=torch.int32, generator=generator)
    try:
        matches = torch.equal(pack(codes, 1), pack_int4(codes))
    except RuntimeError:
        matches = False
    if not matches:
        logger.warning("torch's int4 CPU packing changed: int4 layers run the dequantizing path")
    return matches


class Int4Linear(QuantizedLinear):
    # The packed codes; with the native kernel's format its scales and zero points, else
    # PyTorch's scales_and_zeros (see __init__).
    weight_int4: torch.Tensor
    scales: torch.Tensor
    zero_points: torch.Tensor
    scales_and_zeros: torch.Tensor
    # groups of a checkpoint's codes that `from_codes` had to refit to the native grid
    num_refitted_groups: int = 0

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        group_size: int,
        *,
        native_kernels: bool = True,
        dtype: torch.dtype | None = None,
    ) -> None:
        """`native_kernels`: use the native int4 kernel's format where it is supported (False:
        PyTorch's format and kernels only, as EngineConfig.native_kernels says). `dtype`: the
        model's (default: the weight's), which decides the format and PyTorch's scale dtype."""
        super().__init__()
        dtype = dtype or weight.dtype
        self._start(weight.shape, bias, group_size, dtype, weight.device, native_kernels)
        groups = self._padded(weight.float()).view(self._padded_rows, -1, group_size)
        if self.is_native:
            self._store_native(*quantize_int4_vnni(groups))
            return
        low, high = groups.amin(dim=-1), groups.amax(dim=-1)
        scales = ((high - low) / 15).clamp(min=1e-12).to(dtype)
        zeros = (low + 8 * scales.float()).to(dtype)
        codes = torch.round(
            (groups - zeros.float()[..., None]) / scales.float()[..., None] + 8
        ).clamp(0, 15)
        self._store_torch(codes.view(self._padded_rows, -1), scales, zeros)

    @classmethod
    def from_codes(
        cls,
        codes: torch.Tensor,
        scales: torch.Tensor,
        offsets: torch.Tensor,
        bias: torch.Tensor | None,
        group_size: int,
        *,
        dtype: torch.dtype,
        native_kernels: bool = True,
    ) -> Int4Linear:
        """The layer of weights w = scales * q + offsets, per group of `group_size` columns:
        codes uint8 [out, in] in [0, 15], scales and offsets float32 [out, in / group_size]
        (GGUF's Q4_0 / Q4_1 / Q4_K blocks, gguf_blocks.py), kept as they are.

        PyTorch's format holds them exactly (zero = offset + 8 scale, both in `dtype`). The
        native one has a bf16 scale s and a zero point z in sixteenths of s: s = scale rounded
        to bf16, z = round(-16 offset / s), so a weight moves by at most 15 |scale - s| + s / 32.
        A group whose z does not fit a byte (values all of one sign) is refitted from its values
        (`quantize_int4_vnni`); `num_refitted_groups` counts them. The layer takes `codes` over:
        refitted groups are rewritten in it.
        """
        layer = cls.__new__(cls)
        QuantizedLinear.__init__(layer)
        layer._start(codes.shape, bias, group_size, dtype, codes.device, native_kernels)
        # NOTE: padding rows get a scale of 1, so their (zero) groups map to the grid as they are.
        codes, offsets = layer._padded(codes), layer._padded(offsets)
        scales = layer._padded(scales, fill=1.0)
        if layer.is_native:
            *native, layer.num_refitted_groups = _codes_to_native_grid(
                codes, scales, offsets, group_size
            )
            layer._store_native(*native)
            return layer
        scales_in_dtype = scales.to(dtype)
        zeros = (offsets + 8 * scales_in_dtype.float()).to(dtype)
        layer._store_torch(codes, scales_in_dtype, zeros)
        return layer

    def _start(
        self,
        shape: torch.Size | tuple[int, ...],
        bias: torch.Tensor | None,
        group_size: int,
        dtype: torch.dtype,
        device: torch.device,
        native_kernels: bool,
    ) -> None:
        self.out_features, self.in_features = shape
        if self.in_features % group_size:
            raise ValueError(
                f"a linear layer with {self.in_features} input features cannot be quantized in "
                f"groups of {group_size}; choose a quantization_group_size that divides it"
            )
        self.group_size = group_size
        # NOTE: rows padded to a multiple of 64 (the kernel's row block) with zeros; the extra
        # outputs are sliced off.
        self._padded_rows = -(-self.out_features // INT4_ROW_BLOCK) * INT4_ROW_BLOCK
        self.is_native = native_kernels and native_int4.is_supported(
            self.in_features, group_size, dtype, device
        )
        self.dtype = dtype
        self.register_buffer("bias", bias)
        self._native_matmul = None

    def _padded(self, rows: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """`rows` [out, ...] with rows of `fill` up to the padded row count."""
        missing = self._padded_rows - rows.shape[0]
        if not missing:
            return rows
        return torch.cat((rows, rows.new_full((missing, *rows.shape[1:]), fill)))

    def _store_native(
        self, codes: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor
    ) -> None:
        """codes [rows, groups, group_size], scales and zero points [groups, rows]."""
        self.register_buffer("weight_int4", pack_int4_vnni(codes.view(self._padded_rows, -1)))
        self.register_buffer("scales", scales)  # [num_groups, padded_rows] bf16
        self.register_buffer("zero_points", zero_points)  # [num_groups, padded_rows] uint8
        self.max_kernel_tokens = NATIVE_INT4_MAX_TOKENS
        self._native_matmul = int4_matmul(
            self.weight_int4, scales, zero_points, self.group_size, self.out_features, self.dtype
        )

    def _store_torch(self, codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor) -> None:
        """codes [rows, in], scales and zeros [rows, groups] in the model dtype."""
        self.register_buffer("weight_int4", pack_int4(codes))
        # [num_groups, padded_rows, 2]: the kernel's scales_and_zeros layout
        self.register_buffer(
            "scales_and_zeros", torch.stack((scales, zeros), dim=-1).transpose(0, 1).contiguous()
        )

    def can_use_kernel(self, x: torch.Tensor) -> bool:
        if self.is_native:
            return x.device.type == "cpu" and x.dtype == self.dtype
        return super().can_use_kernel(x) and _torch_int4_layout_matches()

    def kernel_matmul(self, x: torch.Tensor) -> torch.Tensor:
        if self._native_matmul is not None:
            return self._native_matmul(x.contiguous())
        y = torch._weight_int4pack_mm_for_cpu(
            x, self.weight_int4, self.group_size, self.scales_and_zeros.to(x.dtype)
        )
        return y if y.shape[1] == self.out_features else y[:, : self.out_features]

    def dequantize_rows(self, start: int, end: int, dtype: torch.dtype) -> torch.Tensor:
        # NOTE: unpacking works on whole 64-row blocks; `start` is always a multiple of 64.
        block_end = -(-end // INT4_ROW_BLOCK) * INT4_ROW_BLOCK
        if self.is_native:
            codes = unpack_int4_vnni(self.weight_int4[start:block_end])[: end - start]
            return self._dequantize_native(codes, slice(start, end), dtype)
        codes = unpack_int4(self.weight_int4[start:block_end])[: end - start]
        return self._dequantize(codes, self.scales_and_zeros[:, start:end], dtype)

    def native_dequantize_transposed(
        self, start: int, end: int, dtype: torch.dtype
    ) -> torch.Tensor | None:
        if not self.is_native or self.weight_int4.device.type != "cpu":
            return None
        return native_int4.dequantize_transposed(
            self.weight_int4, self.scales, self.zero_points, self.group_size, start, end, dtype
        )

    def native_int8_codes_transposed(
        self, num_rows: int, *, scratch: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        if not self.is_native or self.weight_int4.device.type != "cpu":
            return None
        return native_int4.int8_codes_transposed(
            self.weight_int4,
            self.scales,
            self.zero_points,
            self.group_size,
            0,
            num_rows,
            self.dtype,
            scratch=scratch,
        )

    def dequantize_row_ids(self, row_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        flat_ids = row_ids.reshape(-1)
        if self.is_native:
            codes = unpack_int4_vnni_rows(self.weight_int4, flat_ids)
            rows = self._dequantize_native(codes, flat_ids, dtype)
            return rows.view(*row_ids.shape, self.in_features)
        blocks = self.weight_int4.view(-1, self.in_features, INT4_ROW_BLOCK // 2)
        half = INT4_ROW_BLOCK // 2
        # [tokens, K] bytes: column (id % 32) of the id's block, high nibble for ids % 64 >= 32
        raw = blocks[
            (flat_ids // INT4_ROW_BLOCK)[:, None],
            torch.arange(self.in_features),
            (flat_ids % half)[:, None],
        ]
        codes = torch.where((flat_ids % INT4_ROW_BLOCK >= half)[:, None], raw >> 4, raw & 15)
        rows = self._dequantize(codes, self.scales_and_zeros[:, flat_ids], dtype)
        return rows.view(*row_ids.shape, self.in_features)

    def _dequantize(
        self, codes: torch.Tensor, scales_and_zeros: torch.Tensor, dtype: torch.dtype
    ) -> torch.Tensor:
        """codes [rows, K] with their scales_and_zeros [groups, rows, 2] -> [rows, K]."""
        num_rows = codes.shape[0]
        scales = scales_and_zeros[..., 0].T.to(dtype).unsqueeze(-1)  # [rows, groups, 1]
        zeros = scales_and_zeros[..., 1].T.to(dtype).unsqueeze(-1)
        grouped = codes.view(num_rows, -1, self.group_size).to(dtype).sub_(8)
        return grouped.mul_(scales).add_(zeros).view(num_rows, self.in_features)

    def _dequantize_native(
        self, codes: torch.Tensor, rows: slice | torch.Tensor, dtype: torch.dtype
    ) -> torch.Tensor:
        """codes [rows, K] of the native format's `rows` -> weights [rows, K] (see
        `quantize_int4_vnni`): s (q - zero_point / 16), in float32, then rounded to `dtype`."""
        num_rows = codes.shape[0]
        scales = self.scales[:, rows].T.float().unsqueeze(-1)  # [rows, groups, 1]
        offsets = self.zero_points[:, rows].T.float().unsqueeze(-1) / 16
        grouped = codes.view(num_rows, -1, self.group_size).float().sub_(offsets).mul_(scales)
        return grouped.view(num_rows, self.in_features).to(dtype)


def _codes_to_native_grid(
    codes: torch.Tensor, scales: torch.Tensor, offsets: torch.Tensor, group_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """`Int4Linear.from_codes`'s mapping: (codes [rows, groups, group_size], bf16 scales and
    uint8 zero points [groups, rows], the number of groups refitted)."""
    num_rows = codes.shape[0]
    # NOTE: no copy (a 1.5B model's token table has 233 MB of codes): refits are written in place.
    grouped = codes.to(torch.uint8).view(num_rows, -1, group_size)
    step = scales.to(torch.bfloat16)
    zero_points = torch.round(-16 * offsets / step.float())
    # NOTE: a negative scale is fine (Q4_0 has them: its d takes the sign of the largest value);
    # a zero one (a constant group) has no zero point.
    fits = (step != 0) & torch.isfinite(zero_points) & (zero_points >= 0) & (zero_points <= 255)
    zero_points = torch.where(fits, zero_points, 0).to(torch.uint8)
    rows, groups = (~fits).nonzero(as_tuple=True)
    if len(rows):
        values = grouped[rows, groups].float() * scales[rows, groups, None]
        values += offsets[rows, groups, None]
        refit_codes, refit_scales, refit_zero_points = quantize_int4_vnni(values[:, None, :])
        grouped[rows, groups] = refit_codes[:, 0]
        step[rows, groups] = refit_scales[0]
        zero_points[rows, groups] = refit_zero_points[0]
    return grouped, step.T.contiguous(), zero_points.T.contiguous(), len(rows)


class QuantizedEmbedding(nn.Module):
    """Token lookup from a quantized weight table (rows dequantized per lookup).

    For tied models `table` is also the model's `lm_head`, so one quantized copy serves both.
    """

    def __init__(self, table: QuantizedLinear, dtype: torch.dtype) -> None:
        super().__init__()
        self.table = table
        self.dtype = dtype

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.table.dequantize_row_ids(input_ids, self.dtype)


def quantize_linear(
    linear: nn.Linear, method: str, group_size: int, *, native_kernels: bool = True
) -> QuantizedLinear:
    weight = linear.weight.detach()
    bias = None if linear.bias is None else linear.bias.detach()
    if method == "int8":
        return Int8Linear(weight, bias, native_kernels=native_kernels)
    return Int4Linear(weight, bias, group_size, native_kernels=native_kernels)


Model = TypeVar("Model", bound=nn.Module)


def quantize_model(
    model: Model,
    method: str,
    group_size: int = DEFAULT_INT4_GROUP_SIZE,
    *,
    native_kernels: bool = True,
) -> Model:
    """Swap the model's linear layers and token embedding for quantized ones, in place.

    `method` "none" (or "auto": a float model's own precision) leaves the model as it is. The
    float weights are released as each module is replaced, so peak memory grows by one layer,
    not one model. `native_kernels`: see `Int4Linear`.
    """
    check_quantization(method, group_size)
    if method in ("none", "auto"):
        return model
    before = model_weight_bytes(model)
    with torch.no_grad():
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear):
                    child_method = TABLE_METHOD if name == "lm_head" else method
                    quantized = quantize_linear(
                        child, child_method, group_size, native_kernels=native_kernels
                    )
                    setattr(parent, name, quantized)
        embedding = getattr(model, "embed_tokens", None)
        if isinstance(embedding, nn.Embedding):
            dtype = embedding.weight.dtype
            table = quantize_linear(
                _as_linear(embedding), TABLE_METHOD, group_size, native_kernels=native_kernels
            )
            model.embed_tokens = QuantizedEmbedding(table, dtype)
            if getattr(model, "lm_head", "absent") is None:
                # NOTE: a tied model's logits use the same table (see LlamaForCausalLM).
                model.lm_head = table
    logger.info(
        "quantized weights to %s%s: %.1f MiB -> %.1f MiB",
        method,
        f" (groups of {group_size})" if method == "int4" else "",
        before / 2**20,
        model_weight_bytes(model) / 2**20,
    )
    return model


def _as_linear(embedding: nn.Embedding) -> nn.Linear:
    with torch.device("meta"):
        linear = nn.Linear(embedding.embedding_dim, embedding.num_embeddings, bias=False)
    linear.weight = embedding.weight
    return linear


def weight_formats(model: nn.Module) -> dict[str, int]:
    """How many weight matrices (linear layers and token tables) `model` holds in each format:
    "int4", "int8" or "float"; a table shared by the embedding and the logits counts once.
    (Before layers/linear.py packs the float ones: it counts `nn.Linear` and `nn.Embedding`.)"""
    counts: dict[str, int] = {}
    seen: set[int] = set()
    for module in model.modules():
        if isinstance(module, Int4Linear | Int8Linear):
            name = "int4" if isinstance(module, Int4Linear) else "int8"
        elif isinstance(module, nn.Linear | nn.Embedding):
            name = "float"
        else:
            continue
        if id(module) not in seen:
            seen.add(id(module))
            counts[name] = counts.get(name, 0) + 1
    return counts


def dense_weight_layers(model: nn.Module, skip: tuple[object, ...] = ()) -> list[QuantizedLinear]:
    """The quantized linear layers of `model` a dense copy would serve (all but `skip`)."""
    return [
        module
        for module in model.modules()
        if isinstance(module, QuantizedLinear) and not any(module is m for m in skip)
    ]


def keep_dense_weights(layers: list[QuantizedLinear], max_kernel_tokens: int) -> int:
    """`keep_dense_weight` on each of `layers`; the bytes the dense copies take."""
    return sum(layer.keep_dense_weight(max_kernel_tokens) for layer in layers)


def model_weight_bytes(model: nn.Module) -> int:
    """Bytes of all weights: parameters and buffers (packed codes, scales), shared ones once."""
    seen: set[int] = set()
    total = 0
    for tensor in [*model.parameters(), *model.buffers()]:
        # NOTE: oneDNN-packed weights (layers/linear.py) are opaque: no data pointer to share.
        key = id(tensor) if tensor.is_mkldnn else tensor.data_ptr()
        if tensor.device.type == "meta" or key in seen:
            continue
        seen.add(key)
        total += tensor.numel() * tensor.element_size()
    return total
