"""The integer GEMM's coding and scaling passes in native calls (`csrc/int8_gemm.c`): a step's
activations coded per token with its outlier columns left out, and the int32 sums scaled back
to the model dtype, each in one pass instead of PyTorch's several, with the same values bit for
bit (layers/int8_gemm.py runs PyTorch's ops where these do not run)."""

from __future__ import annotations

import ctypes

import torch

from inference.engine.kernels import KernelFunction, require

_pointer, _size = ctypes.c_void_p, ctypes.c_int64
_code_tokens = KernelFunction(
    "int8_gemm", "int8_gemm_code_tokens", [_pointer] * 4 + [_size] * 2 + [ctypes.c_int]
)
_scale_sums = KernelFunction(
    "int8_gemm", "int8_gemm_scale_sums", [_pointer] * 4 + [_size] * 2 + [ctypes.c_int]
)
LANES = 16  # csrc: VF_LANES


def is_supported(x: torch.Tensor, out_features: int) -> bool:
    """Whether both passes run natively for activations `x` [tokens, in] and `out_features`."""
    return (
        x.device.type == "cpu"
        and x.dim() == 2
        and x.shape[1] % LANES == 0
        and out_features % LANES == 0
        and _code_tokens(x.dtype) is not None
        and _scale_sums(x.dtype) is not None
    )


def code_tokens(x: torch.Tensor, skip: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [tokens, in] (bf16 or float32) -> (int8 codes [tokens, in], float32 scales [tokens, 1]):
    per token, scale = max(max |x|, tiny) / 127 over the columns where `skip` (uint8 [in], 0 or
    1) is 0, code = round(x / scale), the skipped columns coded 0."""
    x = x.contiguous()
    codes = torch.empty(x.shape, dtype=torch.int8)
    scales = torch.empty(x.shape[0], 1, dtype=torch.float32)
    status = require(_code_tokens(x.dtype), "int8_gemm")(
        x.data_ptr(), skip.data_ptr(), codes.data_ptr(), scales.data_ptr(), x.shape[0],
        x.shape[1], torch.get_num_threads(),
    )  # fmt: skip
    if status != 0:
        raise ValueError(f"{x.shape[1]} input features are not a multiple of {LANES}")
    return codes, scales


def scale_sums(
    sums: torch.Tensor,
    token_scales: torch.Tensor,
    row_scales: torch.Tensor,
    dtype: torch.dtype,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """int32 sums [tokens, out] -> sums * token_scales [tokens, 1] * row_scales [out], float32
    products rounded once to `dtype`, into `out` where given (contiguous, that shape and dtype:
    a block of rows of the caller's result, so that nothing is copied after)."""
    sums = sums.contiguous()
    if out is None:
        out = torch.empty(sums.shape, dtype=dtype)
    elif out.shape != sums.shape or out.dtype != dtype or not out.is_contiguous():
        raise ValueError(
            f"out must be a contiguous {dtype} tensor of shape {tuple(sums.shape)}; got "
            f"{out.dtype} {tuple(out.shape)}{'' if out.is_contiguous() else ' (not contiguous)'}"
        )
    status = require(_scale_sums(dtype), "int8_gemm")(
        sums.data_ptr(), token_scales.data_ptr(), row_scales.data_ptr(), out.data_ptr(),
        sums.shape[0], sums.shape[1], torch.get_num_threads(),
    )  # fmt: skip
    if status != 0:
        raise ValueError(f"{sums.shape[1]} output features are not a multiple of {LANES}")
    return out
