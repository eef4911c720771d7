"""EngineConfig: what one engine instance loads and how much work it takes on per step."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch

from inference.engine.kv_cache import KV_CACHE_DTYPES
from inference.engine.layers.quantization import DEFAULT_INT4_GROUP_SIZE, check_quantization

DTYPE_NAMES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


# NOTE: more drafts than this are almost never all accepted, and each costs a verified position.
MAX_SPECULATIVE_TOKENS = 16
# Where drafts come from: n-gram prompt lookup (core/speculative.py) or a small draft model of the
# same vocabulary (draft_proposer.py).
SPECULATIVE_METHODS = ("ngram", "draft")


class ConfigError(ValueError):
    """An engine setting is invalid; the message names the setting and the accepted values."""


def has_fast_bfloat16(device: str = "cpu") -> bool:
    """Whether bf16 matrix work is native here (AMX / AVX512-BF16 CPUs, most GPUs).

    NOTE: on CPUs without it (e.g. AVX2-only) torch emulates bf16 and runs several times slower
    than float32, so "auto" picks float32 there.
    """
    if device.startswith("cuda"):
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    cpu = torch.cpu
    checks = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(getattr(cpu, check, lambda: False)() for check in checks)


def resolve_auto_dtype(device: str = "cpu") -> torch.dtype:
    if has_fast_bfloat16(device):
        return torch.bfloat16
    return torch.float16 if device.startswith("cuda") else torch.float32


def parse_dtype(value: str | torch.dtype, device: str = "cpu") -> torch.dtype:
    """A dtype from its name ("auto": bfloat16 where it is fast, else float32 on CPUs)."""
    if value == "auto":
        return resolve_auto_dtype(device)
    if isinstance(value, torch.dtype):
        if value not in DTYPE_NAMES.values():
            raise ConfigError(f"dtype {value} is not supported; use one of {sorted(DTYPE_NAMES)}")
        return value
    name = str(value).lower().removeprefix("torch.")
    aliases = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
    name = aliases.get(name, name)
    if name not in DTYPE_NAMES:
        raise ConfigError(f"dtype {value!r} is not supported; use one of {sorted(DTYPE_NAMES)}")
    return DTYPE_NAMES[name]


@dataclass(slots=True)
class EngineConfig:
    """Settings for one `Engine`: the one list of the engine's knobs and their defaults.

    `kv_cache_mb` is the memory given to the paged KV cache; the model runner turns it into a
    number of blocks of `block_size` tokens. `max_num_batched_tokens` is the token budget of one
    step (decode tokens plus prefill chunks); prompts longer than it are prefilled in chunks.

    NOTE: the field names are part of the interface: Django's settings and the admin's
    ModelConfig map onto them by name (inference/runtime.py).
    """

    model_dir: Path | str
    dtype: str | torch.dtype = "auto"
    max_model_len: int = 2048
    kv_cache_mb: float = 512.0
    block_size: int = 16
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 512
    enable_prefix_caching: bool = True
    # "cpu", "cuda" / "cuda:N", or "auto" (cuda where PyTorch sees a CUDA device, else cpu).
    device: str = "cpu"
    # torch threads of the engine thread (0: torch's default, one per core); see engine.py.
    num_threads: int = 0
    # Fewer threads (at least one) while other processes keep cores busy: core_share.py.
    adaptive_threads: bool = True
    # Weight formats: "auto" follows the checkpoint (a GGUF's tensor types, gguf_checkpoint.py;
    # an AWQ / GPTQ / compressed-tensors checkpoint's int4 layers, quantized_checkpoint.py; a
    # float checkpoint loads in `dtype`), "none" is `dtype` throughout, "int8" / "int4" quantize
    # every linear layer (quantization.py; int4 checkpoints keep their codes and groups); the int4
    # group size of "int4" (a GGUF's 4-bit blocks are groups of 32); "int8" kv_cache_dtype halves
    # the KV bytes per token (kv_cache.py).
    quantization: str = "auto"
    quantization_group_size: int = DEFAULT_INT4_GROUP_SIZE
    kv_cache_dtype: str = "auto"
    # Speculative decoding by n-gram prompt lookup (speculative.py): up to this many draft tokens
    # per step (0: off), looked up by the last speculative_ngram_max..min tokens, and only while
    # at most speculative_max_num_seqs sequences decode (measured in bf16 on 2 cores: +31% at 2
    # sequences, even at 3-4, -18% at 8, where each verification's own attention call per layer
    # costs more than the drafts save). A minimum of 2 tokens: 1-token matches are mostly wrong
    # guesses outside quotes (free-form answers lost 13% with them in float32, 0-3% without).
    num_speculative_tokens: int = 0
    speculative_ngram_min: int = 2
    speculative_ngram_max: int = 3
    speculative_max_num_seqs: int = 4
    # speculative_method "draft": a small model of the same tokenizer (draft_model_dir, loaded
    # in this config's dtype, quantization and KV format) proposes the drafts greedily instead;
    # it has its own KV cache of draft_kv_cache_mb (None: room for as many tokens as the
    # target's cache). The same limits apply (num_speculative_tokens, speculative_max_num_seqs).
    speculative_method: str = "ngram"
    draft_model_dir: Path | str | None = None
    draft_kv_cache_mb: float | None = None
    # The draft model's weight formats (None: `quantization`'s). A draft only proposes and the
    # target checks every token, so its formats move the speed-up, never the output: "int4"
    # puts a draft on the native int4 kernel and the fused decode where a GGUF's own formats
    # would not (Qwen2.5-Coder-0.5B's Q5_0 tensors load as int8, which runs layer by layer).
    draft_quantization: str | None = None
    # The native CPU kernels (kernels/) where the CPU and the model allow them; False: the
    # PyTorch path only. fused_decode: pure decode steps run all layers in one native call
    # (kernels/decode_layers.py); False runs them layer by layer, with the same results bit for
    # bit (for comparisons).
    native_kernels: bool = True
    fused_decode: bool = True
    # The prefix cache's disk tier (kv_disk_cache.py): every cached block also written under
    # this directory (None: memory only), at most kv_disk_cache_mb of them, least recently used
    # evicted; prompts whose leading blocks memory lost (a restart) read them back.
    kv_disk_cache_dir: Path | str | None = None
    kv_disk_cache_mb: float = 4096.0
    # Chunk-KV reuse (core/chunk_reuse.py): prompts that name their passages (`reusable`) copy
    # the keys/values of passages computed on their own instead of prefilling them, recomputing
    # chunk_kv_recompute_tokens of each: those whose keys/values the prompt's context changes
    # most ("deviation", measured at an early layer), or the passage's first ones ("leading").
    # Approximate: off unless chosen.
    chunk_kv_reuse: bool = False
    chunk_kv_recompute_tokens: int = 16
    chunk_kv_selection: str = "deviation"
    # Quantized layers' weights for prefill-sized steps (model_runner.py, "Prefill weights" in
    # the README): "dense" keeps a copy in the model dtype, so those steps (and decode steps
    # of many sequences) run one GEMM instead of dequantizing every weight each time (more
    # memory: the 1.5B's 3.3 GiB); "int8" runs those steps as one integer GEMM on the CPU's
    # int8 dot products (layers/int8_gemm.py), on codes made for each step (kept, a byte a
    # weight, where no native kernel makes them); "quantized" dequantizes; "auto": dense on CPUs
    # with AMX (bf16) where the copy fits, int8 on other CPUs with VNNI, else quantized.
    prefill_weights: str = "auto"
    # Prefill chunks' attention (model_runner.py): "native" reads each chunk's context where the
    # paged cache holds it, with the native kernel (kernels/paged_prefill_attention.py: bf16 on
    # CPUs with AVX-512 BF16, float32 on every CPU the kernels build for; elsewhere PyTorch's
    # path, with a log line); "pytorch" gathers the context for PyTorch's flash attention;
    # "auto" is native where the kernel runs and was measured faster: bf16 on CPUs without AMX
    # (PyTorch's kernel multiplies on AMX tiles there), float32 on AVX-512 CPUs.
    prefill_attention: str = "auto"

    def __post_init__(self) -> None:
        self.model_dir = Path(self.model_dir)
        self.device = resolve_device(self.device)
        self.dtype = parse_dtype(self.dtype, self.device)
        _check_int("max_model_len", self.max_model_len, minimum=2)
        _check_int("block_size", self.block_size, minimum=1)
        _check_int("max_num_seqs", self.max_num_seqs, minimum=1)
        _check_int("max_num_batched_tokens", self.max_num_batched_tokens, minimum=1)
        _check_int("num_threads", self.num_threads, minimum=0)
        if self.max_num_batched_tokens < self.max_num_seqs:
            # NOTE: every running sequence needs a token of budget per step to decode at all.
            raise ConfigError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                f"max_num_seqs ({self.max_num_seqs})"
            )
        if isinstance(self.kv_cache_mb, bool) or not isinstance(self.kv_cache_mb, int | float):
            raise ConfigError(
                f"kv_cache_mb must be a number of megabytes, got {self.kv_cache_mb!r}"
            )
        if not self.kv_cache_mb > 0:
            raise ConfigError(f"kv_cache_mb must be > 0, got {self.kv_cache_mb}")
        _check_int("chunk_kv_recompute_tokens", self.chunk_kv_recompute_tokens, minimum=0)
        if self.chunk_kv_selection not in CHUNK_KV_SELECTIONS:
            raise ConfigError(
                f"chunk_kv_selection must be one of {list(CHUNK_KV_SELECTIONS)}, "
                f"got {self.chunk_kv_selection!r}"
            )
        if self.prefill_weights not in PREFILL_WEIGHTS:
            raise ConfigError(
                f"prefill_weights must be one of {list(PREFILL_WEIGHTS)}, "
                f"got {self.prefill_weights!r}"
            )
        if self.prefill_attention not in PREFILL_ATTENTION:
            raise ConfigError(
                f"prefill_attention must be one of {list(PREFILL_ATTENTION)}, "
                f"got {self.prefill_attention!r}"
            )
        for name in ("enable_prefix_caching", "native_kernels", "fused_decode", "chunk_kv_reuse"):
            _check_bool(name, getattr(self, name))
        try:
            check_quantization(self.quantization, self.quantization_group_size)
        except ValueError as error:
            raise ConfigError(str(error)) from None
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError(
                f"kv_cache_dtype {self.kv_cache_dtype!r} is not supported; "
                f"use one of {list(KV_CACHE_DTYPES)}"
            )
        self._check_disk_cache_settings()
        _check_int("num_speculative_tokens", self.num_speculative_tokens, minimum=0)
        if self.num_speculative_tokens > MAX_SPECULATIVE_TOKENS:
            raise ConfigError(
                f"num_speculative_tokens must be <= {MAX_SPECULATIVE_TOKENS}, "
                f"got {self.num_speculative_tokens}"
            )
        _check_int("speculative_ngram_min", self.speculative_ngram_min, minimum=1)
        _check_int("speculative_ngram_max", self.speculative_ngram_max, minimum=1)
        if self.speculative_ngram_max < self.speculative_ngram_min:
            raise ConfigError(
                f"speculative_ngram_max ({self.speculative_ngram_max}) must be >= "
                f"speculative_ngram_min ({self.speculative_ngram_min})"
            )
        _check_int("speculative_max_num_seqs", self.speculative_max_num_seqs, minimum=1)
        self._check_draft_settings()

    def _check_disk_cache_settings(self) -> None:
        directory = self.kv_disk_cache_dir
        if directory is not None:
            if not isinstance(directory, str | Path) or not str(directory):
                raise ConfigError(f"kv_disk_cache_dir must be a directory, got {directory!r}")
            self.kv_disk_cache_dir = Path(directory)
        mb = self.kv_disk_cache_mb
        if isinstance(mb, bool) or not isinstance(mb, int | float) or not mb > 0:
            raise ConfigError(f"kv_disk_cache_mb must be a number of megabytes > 0, got {mb!r}")

    @property
    def kv_disk_cache_bytes(self) -> int:
        return int(self.kv_disk_cache_mb * 1024 * 1024)

    def _check_draft_settings(self) -> None:
        if self.speculative_method not in SPECULATIVE_METHODS:
            raise ConfigError(
                f"speculative_method {self.speculative_method!r} is not supported; "
                f"use one of {list(SPECULATIVE_METHODS)}"
            )
        if self.draft_model_dir is not None:
            if not isinstance(self.draft_model_dir, str | Path) or not str(self.draft_model_dir):
                raise ConfigError(
                    f"draft_model_dir must be a model directory, got {self.draft_model_dir!r}"
                )
            self.draft_model_dir = Path(self.draft_model_dir)
        if self.speculative_method == "draft" and self.draft_model_dir is None:
            raise ConfigError("speculative_method 'draft' needs draft_model_dir (the draft model)")
        if self.speculative_method != "draft" and self.draft_model_dir is not None:
            raise ConfigError(
                f"draft_model_dir is only used with speculative_method 'draft', "
                f"not {self.speculative_method!r}"
            )
        if self.draft_quantization is not None:
            try:
                check_quantization(self.draft_quantization, self.quantization_group_size)
            except ValueError as error:
                raise ConfigError(f"draft_quantization: {error}") from None
        mb = self.draft_kv_cache_mb
        if mb is not None:
            if isinstance(mb, bool) or not isinstance(mb, int | float):
                raise ConfigError(f"draft_kv_cache_mb must be a number of megabytes, got {mb!r}")
            if not mb > 0:
                raise ConfigError(f"draft_kv_cache_mb must be > 0, got {mb}")

    @property
    def uses_draft_model(self) -> bool:
        """Whether the engine loads a draft model (speculation on, by a draft model)."""
        return self.speculative_method == "draft" and self.num_speculative_tokens > 0

    def draft_config(self) -> EngineConfig:
        """The draft model's runner settings: this config's dtype and limits, its own KV cache
        and (with `draft_quantization`) weight formats."""
        if self.draft_model_dir is None:
            raise ConfigError("speculative_method 'draft' needs draft_model_dir (the draft model)")
        kv_cache_mb = self.kv_cache_mb if self.draft_kv_cache_mb is None else self.draft_kv_cache_mb
        return replace(
            self,
            model_dir=self.draft_model_dir,
            kv_cache_mb=kv_cache_mb,
            quantization=self.draft_quantization or self.quantization,
            num_speculative_tokens=0,
            speculative_method="ngram",
            draft_model_dir=None,
            draft_kv_cache_mb=None,
            draft_quantization=None,
            kv_disk_cache_dir=None,
        )

    @property
    def kv_cache_bytes(self) -> int:
        return int(self.kv_cache_mb * 1024 * 1024)


def _check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be True or False, got {value!r}")


PREFILL_WEIGHTS = ("auto", "dense", "int8", "quantized")
PREFILL_ATTENTION = ("auto", "native", "pytorch")
CHUNK_KV_SELECTIONS = ("deviation", "leading")


def resolve_device(name: object) -> str:
    """The device an engine runs on: "auto" is "cuda" where PyTorch sees a CUDA device, else
    "cpu"; a named device is checked to be there (ConfigError names what is missing)."""
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"device must be a device name such as 'cpu', got {name!r}")
    name = name.strip().lower()
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(
            f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {name!r}"
        ) from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
            raise ConfigError(
                f"device {name!r}: PyTorch sees no CUDA device (torch {torch.__version__}, {build})"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(
                f"device {name!r}: there are {torch.cuda.device_count()} CUDA device(s)"
            )
    elif device.type != "cpu":
        raise ConfigError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {name!r}")
    return name


def _check_int(name: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")
