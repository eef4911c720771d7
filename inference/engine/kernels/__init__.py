"""Native CPU kernels: C sources in `csrc/`, compiled once per machine and loaded with ctypes.

One Python module per C source, named after it (`rms_norm.py` wraps `csrc/rms_norm.c`), holds
the ctypes op and one `is_supported(...)`: True when the CPU has the instructions the kernel
needs, the build succeeded and, where it takes tensors or shapes, these fit the kernel (dtype,
device, multiples of its tile sizes). Callers check it and otherwise keep their PyTorch path;
torch modules that use a kernel live in layers/ (and models/). This module builds, caches and
loads the libraries.

The kernels are an optional fast path: when a CPU lacks the instructions they need, no C
compiler is installed or the build fails, `load_kernel` returns None and the engine keeps its
PyTorch implementation (the log says why, once). An engine configured with
`EngineConfig(native_kernels=False)` never calls them.

Why ctypes and not a PyTorch C++ extension: the sources are plain C over raw pointers, so a
build takes ~2 s with the system compiler and needs neither PyTorch's headers nor ninja. The
libraries are built with `-march=native` for the machine they run on and cached under
`$XDG_CACHE_HOME/cachet/kernels` (default `~/.cache/cachet/kernels`; a temporary directory when
that is not writable), keyed by a hash of the source, the flags, the compiler's version and the
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

logger = logging.getLogger(__name__)

SOURCE_DIR = Path(__file__).parent / "csrc"
COMPILE_FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11")
COMPILE_TIMEOUT_S = 120


@dataclass(frozen=True, slots=True)
class OptionalSource:
    """A file of csrc/ linked only where the CPU has its instructions; the source that calls it
    is compiled with `-D<define>` then, and must do without it otherwise."""

    source: str
    required_cpu_flags: tuple[str, ...]
    define: str


@dataclass(frozen=True, slots=True)
class KernelSpec:
    source: str  # file name in csrc/
    required_cpu_flags: tuple[str, ...]  # as /proc/cpuinfo spells them
    # other files of csrc/ compiled into the same library (kernels the source calls)
    linked_sources: tuple[str, ...] = ()
    optional_sources: tuple[OptionalSource, ...] = ()


KERNELS = {
    "paged_decode_attention": KernelSpec(
        "paged_decode_attention.c", ("avx512f", "avx512bw", "avx512_bf16")
    ),
    "rms_norm": KernelSpec("rms_norm.c", ("avx512f", "avx512bw", "avx512_bf16")),
    "rotary_store": KernelSpec("rotary_store.c", ("avx512f", "avx512bw", "avx512_bf16")),
    "int4_linear": KernelSpec(
        "int4_linear.c", ("avx512f", "avx512bw", "avx512_vnni", "avx512_bf16")
    ),
    "linear_bf16": KernelSpec(
        "linear_bf16.c", ("avx512f", "avx512bw", "avx512_bf16", "amx_tile", "amx_bf16")
    ),
    "silu_and_mul": KernelSpec("silu_and_mul.c", ("avx512f", "avx512bw", "avx512_bf16")),
    # NOTE: the AMX matmul is linked where the CPU has AMX (bf16 models' layers); without it
    # the fused decode still serves models whose layers are all native int4.
    "decode_layers": KernelSpec(
        "decode_layers.c",
        ("avx512f", "avx512bw", "avx512_bf16", "avx512_vnni"),
        linked_sources=(
            "rms_norm.c",
            "rotary_store.c",
            "paged_decode_attention.c",
            "int4_linear.c",
            "silu_and_mul.c",
        ),
        optional_sources=(
            OptionalSource(
                "linear_bf16.c",
                ("avx512f", "avx512bw", "avx512_bf16", "amx_tile", "amx_bf16"),
                "CACHET_WITH_LINEAR_BF16_AMX",
            ),
        ),
    ),
}


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (Linux x86-64); empty elsewhere. Read once per process."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return frozenset()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


def kernel_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "cachet" / "kernels"


@functools.cache
def load_kernel(name: str) -> ctypes.CDLL | None:
    """The compiled library of kernel `name` (see `KERNELS`), or None where it cannot run."""
    spec = KERNELS[name]
    missing = [flag for flag in spec.required_cpu_flags if flag not in cpu_flags()]
    if missing:
        logger.info("native kernel %s not used: the CPU lacks %s", name, ", ".join(missing))
        return None
    try:
        return ctypes.CDLL(str(_build(spec)))
    except (OSError, subprocess.SubprocessError) as error:
        logger.warning("native kernel %s unavailable, using PyTorch instead: %s", name, error)
        return None


def load_function(
    name: str, symbol: str, argtypes: Sequence[type], restype: type | None = ctypes.c_int
) -> Callable[..., Any] | None:
    """Function `symbol` of kernel `name`, typed for ctypes, or None where it cannot run."""
    library = load_kernel(name)
    if library is None:
        return None
    function = getattr(library, symbol)
    function.argtypes = list(argtypes)
    function.restype = restype
    typed: Callable[..., Any] = function
    return typed


Op = TypeVar("Op")


def require(op: Op | None, name: str) -> Op:
    """`op`, or a RuntimeError saying kernel `name` cannot run here: for callers that were to
    check its module's `is_supported` first."""
    if op is None:
        raise RuntimeError(f"the native kernel {name} is not available on this machine")
    return op


def preload() -> list[str]:
    """Build (if needed) and load every kernel this machine can run; returns their names.

    Called when a model is loaded, so that a first build (seconds) happens at start-up and not
    inside the first request.
    """
    return [name for name in KERNELS if load_kernel(name) is not None]


@functools.cache
def _compiler_version(compiler: str) -> str:
    return subprocess.run(
        [compiler, "--version"], capture_output=True, text=True, timeout=30, check=True
    ).stdout


def _build(spec: KernelSpec) -> Path:
    compiler = os.environ.get("CC") or "cc"
    if shutil.which(compiler) is None:
        raise OSError(f"no C compiler {compiler!r} on PATH")
    source = SOURCE_DIR / spec.source
    optional = [
        extra for extra in spec.optional_sources if cpu_flags().issuperset(extra.required_cpu_flags)
    ]
    sources = [
        source,
        *(SOURCE_DIR / name for name in spec.linked_sources),
        *(SOURCE_DIR / extra.source for extra in optional),
    ]
    flags = [*COMPILE_FLAGS, *(f"-D{extra.define}" for extra in optional)]
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
    library = kernel_cache_dir() / f"{source.stem}-{key.hexdigest()[:16]}.so"
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
