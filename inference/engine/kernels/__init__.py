"""Native CPU kernels: C sources in `csrc/`, compiled once per machine and loaded with ctypes.

One Python module per C source, named after it (`rms_norm.py` wraps `csrc/rms_norm.c`), holds
the ctypes op and one `is_supported(...)`: True when the CPU has the instructions the kernel
needs, the build succeeded and, where it takes tensors or shapes, these fit the kernel (dtype,
device, multiples of its tile sizes). Callers check it and otherwise keep their PyTorch path;
torch modules that use a kernel live in layers/ (and models/). This module builds, caches and
loads the libraries.

Instruction sets: the sources are written once against `csrc/simd.h`, which maps 16-lane float
vectors onto the instruction set of the build. `ISA_LEVELS` lists those from the best down:
AVX-512 with BF16 and VNNI (Sapphire Rapids, Zen 4 and later), AVX-512 (Skylake-SP, Ice Lake),
AVX2 with FMA (x86-64-v3: nearly every x86 laptop, desktop and server since 2015), and aarch64
NEON (with the dot-product instructions where the CPU has them: Graviton 2+, Apple M-series).
The best level the CPU's flags allow is used; `CACHET_KERNEL_ISA=<level>` forces a lower one
(tests run every level the machine can). Each library is built for one activation type too,
bf16 or float32 (`ACTIVATIONS`): bf16 where the CPU has native bf16 arithmetic, float32 on the
others, where PyTorch emulates bf16 and the engine runs float32 models (config.has_fast_bfloat16).

The kernels are an optional fast path: when a CPU lacks the instructions they need, no C
compiler is installed or the build fails, `load_kernel` returns None and the engine keeps its
PyTorch implementation (the log says why, once). An engine configured with
`EngineConfig(native_kernels=False)` never calls them.

Why ctypes and not a PyTorch C++ extension: the sources are plain C over raw pointers, so a
build takes ~2 s with the system compiler and needs neither PyTorch's headers nor ninja. The
libraries are built for the level's instruction set (`-march=x86-64-v3`, ...) and cached under
`$XDG_CACHE_HOME/cachet/kernels` (default `~/.cache/cachet/kernels`; a temporary directory when
that is not writable), keyed by a hash of the sources, the flags, the compiler's version and the
CPU's flags, so a home directory shared between machines never loads a library built for
another CPU. OpenMP: the library links libgomp by its soname, which resolves to the copy
PyTorch has already loaded into the process, so both share one thread pool.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

logger = logging.getLogger(__name__)

SOURCE_DIR = Path(__file__).parent / "csrc"
COMPILE_FLAGS = (
    "-O3",
    "-fopenmp",
    "-shared",
    "-fPIC",
    "-std=c11",
    "-Werror=implicit-function-declaration",
)
COMPILE_TIMEOUT_S = 120
ISA_ENVIRONMENT_VARIABLE = "CACHET_KERNEL_ISA"


@dataclass(frozen=True, slots=True)
class IsaLevel:
    """An instruction set the kernels are built for: the CPU flags it needs (as /proc/cpuinfo
    spells them) and the compiler flags that target it."""

    name: str
    machine: str  # platform.machine() of the CPUs that have it
    required_cpu_flags: tuple[str, ...]
    compile_flags: tuple[str, ...]


_X86_64_V3 = ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe", "xsave")
_X86_64_V4 = (*_X86_64_V3, "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")
# Best first: a CPU runs the first level whose flags it has.
ISA_LEVELS = (
    IsaLevel(
        "avx512_bf16",
        "x86_64",
        (*_X86_64_V4, "avx512_bf16", "avx512_vnni"),
        ("-march=x86-64-v4", "-mavx512bf16", "-mavx512vnni"),
    ),
    # NOTE: VNNI without BF16: Cascade Lake, Ice Lake, Tiger / Rocket Lake, and hosts that pass
    # a newer Xeon's VNNI but not its BF16 through; one instruction per 4-byte dot product
    # where the level below takes three.
    IsaLevel(
        "avx512_vnni",
        "x86_64",
        (*_X86_64_V4, "avx512_vnni"),
        ("-march=x86-64-v4", "-mavx512vnni"),
    ),
    IsaLevel("avx512", "x86_64", _X86_64_V4, ("-march=x86-64-v4",)),
    IsaLevel("avx2", "x86_64", _X86_64_V3, ("-march=x86-64-v3",)),
    IsaLevel("neon_dotprod", "aarch64", ("asimd", "asimddp"), ("-march=armv8.2-a+dotprod",)),
    IsaLevel("neon", "aarch64", ("asimd",), ("-march=armv8-a",)),
)
ISA_LEVEL_NAMES = tuple(level.name for level in ISA_LEVELS)
# The activation types a library can be built for, by the torch dtype of the model.
ACTIVATIONS = {torch.bfloat16: "bf16", torch.float32: "float32"}
_ACTIVATION_FLAGS = {"bf16": (), "float32": ("-DCACHET_ACTIVATION_FLOAT32",)}


@dataclass(frozen=True, slots=True)
class OptionalSource:
    """A file of csrc/ linked only where the CPU has its instructions; the source that calls it
    is compiled with `-D<define>` then, and must do without it otherwise."""

    source: str
    required_cpu_flags: tuple[str, ...]
    define: str
    only_level: str | None = None
    compile_flags: tuple[str, ...] = ()


_AMX_FLAGS = ("amx_tile", "amx_bf16")
_AMX_COMPILE_FLAGS = ("-mamx-tile", "-mamx-bf16")
_INT8_DOT_PRODUCT_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})


@dataclass(frozen=True, slots=True)
class KernelSpec:
    source: str  # file name in csrc/
    # other files of csrc/ compiled into the same library (kernels the source calls)
    linked_sources: tuple[str, ...] = ()
    optional_sources: tuple[OptionalSource, ...] = ()
    # beyond an ISA level: the only level it runs at, its flags, its activation types
    only_level: str | None = None
    required_cpu_flags: tuple[str, ...] = ()
    compile_flags: tuple[str, ...] = ()
    activations: tuple[str, ...] = ("bf16", "float32")


KERNELS = {
    "paged_decode_attention": KernelSpec("paged_decode_attention.c"),
    "paged_prefill_attention": KernelSpec("paged_prefill_attention.c"),
    "rms_norm": KernelSpec("rms_norm.c"),
    "rotary_store": KernelSpec("rotary_store.c"),
    "int4_linear": KernelSpec("int4_linear.c"),
    "int8_linear": KernelSpec("int8_linear.c"),
    "int8_gemm": KernelSpec("int8_gemm.c"),
    "linear_bf16": KernelSpec(
        "linear_bf16.c",
        only_level="avx512_bf16",
        required_cpu_flags=_AMX_FLAGS,
        compile_flags=_AMX_COMPILE_FLAGS,
        activations=("bf16",),
    ),
    "silu_and_mul": KernelSpec("silu_and_mul.c"),
    # NOTE: the AMX matmul is linked where the CPU has AMX (bf16 models' layers); without it
    # the fused decode still serves models whose layers are all native int4.
    "decode_layers": KernelSpec(
        "decode_layers.c",
        linked_sources=(
            "rms_norm.c",
            "rotary_store.c",
            "paged_decode_attention.c",
            "paged_prefill_attention.c",
            "int4_linear.c",
            "int8_linear.c",
            "silu_and_mul.c",
        ),
        optional_sources=(
            OptionalSource(
                "linear_bf16.c",
                _AMX_FLAGS,
                "CACHET_WITH_LINEAR_BF16_AMX",
                only_level="avx512_bf16",
                compile_flags=_AMX_COMPILE_FLAGS,
            ),
        ),
    ),
}


def has_amx() -> bool:
    """Whether this CPU has AMX tiles with bf16 (what the AMX matmul needs)."""
    return set(_AMX_FLAGS) <= cpu_flags()


def has_int8_dot_products() -> bool:
    """Whether this x86-64 CPU multiplies int8 in its vector units (VNNI), which PyTorch's
    integer GEMM (`torch._int_mm`, oneDNN) runs at about twice its bf16 GEMM's multiply-adds."""
    return bool(_INT8_DOT_PRODUCT_FLAGS & cpu_flags())


@functools.cache
def machine() -> str:
    """The CPU architecture as ISA_LEVELS names it (x86_64, aarch64). Read once per process:
    every kernel lookup asks (`isa_level`)."""
    return {"AMD64": "x86_64", "arm64": "aarch64"}.get(platform.machine(), platform.machine())


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (Linux: x86-64 "flags", aarch64 "Features"); empty elsewhere.
    Read once per process."""
    if platform.system() != "Linux":
        return frozenset()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


def supported_isa_levels() -> list[IsaLevel]:
    """The levels this CPU can run, the best first."""
    return _levels_for(cpu_flags(), machine())


def _levels_for(flags: frozenset[str], arch: str) -> list[IsaLevel]:
    return [
        level
        for level in ISA_LEVELS
        if level.machine == arch and flags.issuperset(level.required_cpu_flags)
    ]


def isa_level() -> IsaLevel | None:
    """The level the kernels are built for here: the best the CPU has, or the one named by
    $CACHET_KERNEL_ISA; None where the CPU has none (the engine keeps PyTorch).

    Raises ValueError for a $CACHET_KERNEL_ISA that names no level or one this CPU lacks.
    """
    # NOTE: read on every call (tests switch levels), answered from a cache: kernel lookups
    # on the decode path call it.
    return _isa_level(os.environ.get(ISA_ENVIRONMENT_VARIABLE) or None, cpu_flags(), machine())


@functools.cache
def _isa_level(forced: str | None, flags: frozenset[str], arch: str) -> IsaLevel | None:
    supported = _levels_for(flags, arch)
    if not forced:
        return supported[0] if supported else None
    for level in supported:
        if level.name == forced:
            return level
    if forced not in ISA_LEVEL_NAMES:
        raise ValueError(
            f"{ISA_ENVIRONMENT_VARIABLE}={forced!r} is not an instruction set level; use one of "
            f"{', '.join(ISA_LEVEL_NAMES)}"
        )
    raise ValueError(
        f"{ISA_ENVIRONMENT_VARIABLE}={forced!r}: this CPU cannot run it; it can run "
        f"{', '.join(level.name for level in supported) or 'none'}"
    )


def kernel_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "cachet" / "kernels"


def load_kernel(name: str, activation: str = "bf16") -> ctypes.CDLL | None:
    """The compiled library of kernel `name` (see `KERNELS`) for `activation` ("bf16",
    "float32") at this machine's ISA level, or None where it cannot run."""
    return _load_kernel(name, activation, isa_level())


@functools.cache
def _load_kernel(name: str, activation: str, level: IsaLevel | None) -> ctypes.CDLL | None:
    spec = KERNELS[name]
    if level is None:
        logger.info("native kernel %s not used: the CPU has no supported instruction set", name)
        return None
    if spec.only_level not in (None, level.name) or activation not in spec.activations:
        logger.info("native kernel %s does not run at %s / %s", name, level.name, activation)
        return None
    missing = [flag for flag in spec.required_cpu_flags if flag not in cpu_flags()]
    if missing:
        logger.info("native kernel %s not used: the CPU lacks %s", name, ", ".join(missing))
        return None
    try:
        return ctypes.CDLL(str(_build(spec, level, activation)))
    except (OSError, subprocess.SubprocessError) as error:
        logger.warning("native kernel %s unavailable, using PyTorch instead: %s", name, error)
        return None


def forget_loaded_kernels() -> None:
    """Forget the libraries loaded so far (the next load looks at the cache directory again)."""
    _load_kernel.cache_clear()
    _load_function.cache_clear()
    _isa_level.cache_clear()


def load_function(
    name: str,
    symbol: str,
    argtypes: Sequence[type],
    restype: type | None = ctypes.c_int,
    activation: str = "bf16",
) -> Callable[..., Any] | None:
    """Function `symbol` of kernel `name` for `activation`, typed for ctypes, or None where it
    cannot run."""
    return _load_function(name, symbol, tuple(argtypes), restype, activation, isa_level())


@functools.cache
def _load_function(
    name: str,
    symbol: str,
    argtypes: tuple[type, ...],
    restype: type | None,
    activation: str,
    level: IsaLevel | None,
) -> Callable[..., Any] | None:
    library = _load_kernel(name, activation, level)
    if library is None:
        return None
    function = getattr(library, symbol)
    function.argtypes = list(argtypes)
    function.restype = restype
    typed: Callable[..., Any] = function
    return typed


class KernelFunction:
    """A kernel's exported function, looked up for a tensor's dtype: `op(dtype)` is the typed
    ctypes function of the library built for that activation type at the current ISA level, or
    None where there is none (a dtype without kernels, a CPU without the instructions)."""

    def __init__(
        self,
        name: str,
        symbol: str,
        argtypes: Sequence[type],
        restype: type | None = ctypes.c_int,
    ) -> None:
        self.name, self.symbol = name, symbol
        self.argtypes, self.restype = tuple(argtypes), restype

    def __call__(self, dtype: torch.dtype) -> Callable[..., Any] | None:
        activation = ACTIVATIONS.get(dtype)
        if activation is None:
            return None
        return _load_function(
            self.name, self.symbol, self.argtypes, self.restype, activation, isa_level()
        )


Op = TypeVar("Op")


def require(op: Op | None, name: str) -> Op:
    """`op`, or a RuntimeError saying kernel `name` cannot run here: for callers that were to
    check its module's `is_supported` first."""
    if op is None:
        raise RuntimeError(f"the native kernel {name} is not available on this machine")
    return op


def preload(activation: str = "bf16") -> list[str]:
    """Build (if needed) and load every kernel this machine can run for `activation`; returns
    their names.

    Called when a model is loaded, so that a first build (seconds) happens at start-up and not
    inside the first request.
    """
    return [name for name in KERNELS if load_kernel(name, activation) is not None]


@functools.cache
def _compiler_version(compiler: str) -> str:
    return subprocess.run(
        [compiler, "--version"], capture_output=True, text=True, timeout=30, check=True
    ).stdout


def _build(spec: KernelSpec, level: IsaLevel, activation: str) -> Path:
    compiler = os.environ.get("CC") or "cc"
    if shutil.which(compiler) is None:
        raise OSError(f"no C compiler {compiler!r} on PATH")
    source = SOURCE_DIR / spec.source
    optional = [
        extra
        for extra in spec.optional_sources
        if cpu_flags().issuperset(extra.required_cpu_flags)
        and extra.only_level in (None, level.name)
        and activation == "bf16"  # NOTE: the optional sources are AMX's, bf16 only
    ]
    sources = [
        source,
        *(SOURCE_DIR / name for name in spec.linked_sources),
        *(SOURCE_DIR / extra.source for extra in optional),
    ]
    flags = [
        *COMPILE_FLAGS,
        *level.compile_flags,
        *spec.compile_flags,
        *_ACTIVATION_FLAGS[activation],
        *(flag for extra in optional for flag in (f"-D{extra.define}", *extra.compile_flags)),
    ]
    headers = sorted(SOURCE_DIR.glob("*.h"))  # included by the sources: part of the build
    version = _compiler_version(compiler)
    key = hashlib.sha256()
    for part in (
        *(path.read_bytes() for path in [*sources, *headers]),
        " ".join(flags).encode(),
        version.encode(),
    ):
        key.update(part)
    key.update(" ".join(sorted(cpu_flags())).encode())
    name = f"{source.stem}-{level.name}-{activation}-{key.hexdigest()[:16]}.so"
    library = kernel_cache_dir() / name
    if library.exists():
        return library
    try:
        library.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        # NOTE: no writable cache (a service user without a home): build for this process only.
        library = Path(tempfile.mkdtemp(prefix="cachet-kernels-")) / library.name
    # NOTE: built under a temporary name and renamed: processes starting together (server
    # workers, test runners) never load a half-written library.
    with tempfile.TemporaryDirectory(dir=library.parent) as work_dir:
        partial = Path(work_dir) / library.name
        result = subprocess.run(
            [compiler, *flags, "-o", str(partial), *map(str, sources)],
            capture_output=True,
            text=True,
            timeout=COMPILE_TIMEOUT_S,
        )
        if result.returncode != 0:
            raise OSError(f"{compiler} failed on {source.name}: {result.stderr.strip()[-2000:]}")
        os.replace(partial, library)
    logger.info("built native kernel %s", library)
    return library
