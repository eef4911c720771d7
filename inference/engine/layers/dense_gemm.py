"""Dense copies of quantized weights, in the layout the CPU's GEMM reads fastest.

A quantized layer that keeps a dense copy (`QuantizedLinear.keep_dense_weight`) runs steps above
its kernel's token limit as one GEMM in the model dtype instead of unpacking its weight first.
Where oneDNN runs bf16 (`torch.ops.mkldnn`), the copy is kept in oneDNN's own blocked layout
("reordered" once, as PyTorch's inductor does for frozen linear layers), so a GEMM reads its tiles
in order instead of striding through a plain matrix: on a 2-vCPU AMX Xeon the 1.5B's
four matmuls of a layer took 2.5 / 2.9 / 21 ms at 16 / 32 / 512 tokens packed against 7.0 / 5.5
/ 28 ms for `x @ W^T` on the same values (README, "Prefill weights"). Elsewhere (other dtypes,
builds without oneDNN, a packing that fails or disagrees) the copy is W^T, strided, as before.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)

# The dtypes oneDNN's packed linear is used for: bf16 is what AMX and AVX-512 BF16 multiply.
PACKED_DTYPES = (torch.bfloat16,)
# The packed GEMM of a check row may differ from the strided one by accumulation order only.
PACKED_CHECK_TOLERANCE = 1e-2


def packed_linear_available(dtype: torch.dtype) -> bool:
    """Whether this PyTorch build packs weights of `dtype` for oneDNN's linear on this CPU."""
    if dtype not in PACKED_DTYPES or not torch.backends.mkldnn.is_available():  # type: ignore[no-untyped-call]
        return False
    mkldnn = torch.ops.mkldnn
    return (
        hasattr(mkldnn, "_reorder_linear_weight")
        and hasattr(mkldnn, "_linear_pointwise")
        and bool(mkldnn._is_mkldnn_bf16_supported())
    )


@dataclass(frozen=True, slots=True)
class DenseGemmWeight:
    """A layer's weight in the model dtype: oneDNN-packed W [out, in], or strided W^T [in, out]."""

    weight: torch.Tensor
    is_packed: bool
    in_features: int
    out_features: int

    @classmethod
    def from_transposed(cls, weight_t: torch.Tensor) -> DenseGemmWeight:
        """The copy for W^T [in, out]: packed where oneDNN can (and agrees), else W^T itself."""
        in_features, out_features = weight_t.shape
        if weight_t.device.type == "cpu" and packed_linear_available(weight_t.dtype):
            packed = _packed(weight_t)
            if packed is not None:
                return cls(packed, True, in_features, out_features)
        return cls(weight_t, False, in_features, out_features)

    @property
    def dtype(self) -> torch.dtype:
        return self.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.weight.device

    @property
    def nbytes(self) -> int:
        # NOTE: a packed tensor has no storage to measure; its blocks hold the same elements.
        return self.in_features * self.out_features * self.weight.element_size()

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [tokens, in] @ W^T: [tokens, out] in x's dtype."""
        if self.is_packed:
            y: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
                x, self.weight, None, "none", [], ""
            )
            return y
        return torch.matmul(x, self.weight)


def _packed(weight_t: torch.Tensor) -> torch.Tensor | None:
    """oneDNN's packed W for W^T, or None (logged) where packing fails or its GEMM disagrees."""
    try:
        packed: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(
            weight_t.T.contiguous(), None
        )
        check_rows = torch.linspace(-1, 1, 2 * weight_t.shape[0], dtype=torch.float32)
        check_rows = check_rows.reshape(2, -1).to(weight_t.dtype)
        got = torch.ops.mkldnn._linear_pointwise(check_rows, packed, None, "none", [], "")
    except RuntimeError as error:  # a build or CPU where oneDNN refuses: keep the plain copy
        logger.warning("dense weights stay unpacked: oneDNN could not pack one (%s)", error)
        return None
    # NOTE: the strided product in the same dtype: a float32 copy of every layer at load would
    # cost more than the packing itself.
    expected = torch.matmul(check_rows, weight_t).float()
    scale = expected.abs().max().clamp_min(1.0)
    if not torch.isfinite(got).all() or ((got.float() - expected).abs().max() / scale) > (
        PACKED_CHECK_TOLERANCE
    ):
        logger.warning("dense weights stay unpacked: oneDNN's packed GEMM disagreed with W^T")
        return None
    return packed
