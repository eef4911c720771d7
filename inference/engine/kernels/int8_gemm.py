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
_finish_rows = KernelFunction(
    "int8_gemm",
    "int8_gemm_finish_rows",
    [_pointer] * 4 + [_size] + [_pointer] * 3 + [_size] * 2 + [ctypes.c_int],
)
_code_tokens_outliers = KernelFunction(
    "int8_gemm",
    "int8_gemm_code_tokens_outliers",
    [_pointer, _size, _size, ctypes.c_float, _size] + [_pointer] * 4 + [ctypes.c_int] * 2,
    restype=ctypes.c_int64,
)
LANES = 16  # csrc: VF_LANES


def is_supported(x: torch.Tensor, out_features: int) -> bool:
    """Whether the passes run natively for activations `x` [tokens, in] and `out_features`.

    NOTE: one lookup stands for all: they are one library's (int8_gemm.c), and every lookup
    costs ~1.5 us on a path that runs once per layer and step."""
    return (
        x.device.type == "cpu"
        and x.dim() == 2
        and x.shape[1] % LANES == 0
        and out_features % LANES == 0
        and _code_tokens_outliers(x.dtype) is not None
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


def code_tokens_outliers(
    x: torch.Tensor, ratio: float, max_outliers: int, *, unsigned: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [tokens, in] (bf16 or float32) -> (int8 codes [tokens, in], float32 scales [tokens, 1],
    outlier columns int64 [n] ascending, their values float32 [tokens, n]): a column is an
    outlier when its peak |x| passes `ratio` times the median column's peak (the lower middle
    one, the product in x's dtype), at most `max_outliers` of them, the largest; the tokens are
    coded as `code_tokens` codes them with those columns skipped. `unsigned`: the codes plus
    128, as uint8."""
    x = x.contiguous()
    num_tokens, in_features = x.shape
    codes = torch.empty(x.shape, dtype=torch.uint8 if unsigned else torch.int8)
    scales = torch.empty(num_tokens, 1, dtype=torch.float32)
    outlier_ids = torch.empty(max(max_outliers, 1), dtype=torch.int64)
    outlier_x = torch.empty(num_tokens * max(max_outliers, 1), dtype=torch.float32)
    num_outliers = require(_code_tokens_outliers(x.dtype), "int8_gemm")(
        x.data_ptr(), num_tokens, in_features, ratio, max_outliers, codes.data_ptr(),
        scales.data_ptr(), outlier_ids.data_ptr(), outlier_x.data_ptr(), int(unsigned),
        torch.get_num_threads(),
    )  # fmt: skip
    if num_outliers == -1:
        raise ValueError(f"{in_features} input features are not a multiple of {LANES}")
    if num_outliers < 0:
        raise MemoryError("int8_gemm_code_tokens_outliers could not allocate its buffers")
    # NOTE: the kernel wrote the values as rows of num_outliers
    values = outlier_x[: num_tokens * num_outliers].view(num_tokens, num_outliers)
    return codes, scales, outlier_ids[:num_outliers], values


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
    _check_out(out, sums.shape, dtype)
    status = require(_scale_sums(dtype), "int8_gemm")(
        sums.data_ptr(), token_scales.data_ptr(), row_scales.data_ptr(), out.data_ptr(),
        sums.shape[0], sums.shape[1], torch.get_num_threads(),
    )  # fmt: skip
    if status != 0:
        raise ValueError(f"{sums.shape[1]} output features are not a multiple of {LANES}")
    return out


def finish_rows(
    y: torch.Tensor,
    token_scales: torch.Tensor,
    outlier_x: torch.Tensor,
    outlier_ids: torch.Tensor,
    codes_t: torch.Tensor,
    row_scales: torch.Tensor,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """y [tokens, out] (a packed GEMM's sums times `row_scales`) -> y * token_scales [tokens, 1]
    + (outlier_x [tokens, n] float32 @ codes_t [in, out] int8's rows `outlier_ids` [n]) *
    row_scales, float32 rounded once to y's dtype, into `out` where given (else in place)."""
    if out is None:
        out = y
    _check_out(out, y.shape, y.dtype)
    if not (y.is_contiguous() and codes_t.is_contiguous() and codes_t.shape[1] == y.shape[1]):
        raise ValueError("y and codes_t must be contiguous, with as many columns")
    outlier_x = outlier_x.float().contiguous()
    outlier_ids = outlier_ids.to(torch.int64).contiguous()
    status = require(_finish_rows(y.dtype), "int8_gemm")(
        y.data_ptr(), token_scales.data_ptr(), outlier_x.data_ptr(), outlier_ids.data_ptr(),
        outlier_ids.numel(), codes_t.data_ptr(), row_scales.data_ptr(), out.data_ptr(),
        y.shape[0], y.shape[1], torch.get_num_threads(),
    )  # fmt: skip
    if status != 0:
        raise ValueError(f"{y.shape[1]} output features are not a multiple of {LANES}")
    return out


def _check_out(out: torch.Tensor, shape: torch.Size, dtype: torch.dtype) -> None:
    """Raise ValueError unless `out` is a contiguous `dtype` tensor of `shape`."""
    if out.shape != shape or out.dtype != dtype or not out.is_contiguous():
        raise ValueError(
            f"out must be a contiguous {dtype} tensor of shape {tuple(shape)}; got "
            f"{out.dtype} {tuple(out.shape)}{'' if out.is_contiguous() else ' (not contiguous)'}"
        )
