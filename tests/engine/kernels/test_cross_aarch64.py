"""The kernels' aarch64 NEON builds (csrc/simd.h's NEON section), cross-compiled and run under
qemu-aarch64, against the PyTorch references of the x86 tests.

Each instruction set level the engine builds for aarch64 (`ISA_LEVELS`: armv8-a, and armv8.2-a
with the dot-product instructions) is compiled once per session for each activation type (bf16,
float32), into one static program (cross/kernel_driver.c) that runs a kernel on arrays read from
files. qemu emulates the oldest CPU of each level (Cortex-A53, Neoverse N1), so an instruction
beyond the level stops the program. Shapes are small: code runs several times slower under qemu.

Needs `aarch64-linux-gnu-gcc` and `qemu-aarch64` (Debian: gcc-aarch64-linux-gnu, qemu-user;
`make cross-toolchain`); skipped without them.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from inference.engine.kernels import (
    ACTIVATIONS,
    COMPILE_FLAGS,
    ISA_LEVELS,
    KERNELS,
    SOURCE_DIR,
    IsaLevel,
)
from inference.engine.kernels.int4_linear import pack_int4_vnni, quantize_int4_vnni
from inference.engine.kernels.int8_linear import pack_int8, padded_rows
from inference.engine.kernels.paged_decode_attention import context_partitions
from inference.engine.layers.attention import build_attention_metadata
from inference.engine.layers.quantization import quantize_rows_int8
from inference.engine.layers.rotary import RopeArgs, RotaryEmbedding, apply_rotary
from tests.engine.kernels.conftest import assert_same_values
from tests.engine.kernels.test_int4_linear import relative_error
from tests.engine.kernels.test_paged_decode_attention import (
    random_cache,
    scattered_block_tables,
    tolerance,
)
from tests.engine.kernels.test_paged_decode_attention import reference as attention_reference
from tests.engine.kernels.test_paged_prefill_attention import (
    FLOAT32_TOLERANCE as FLOAT32_PREFILL_TOLERANCE,
)
from tests.engine.kernels.test_paged_prefill_attention import paged_inputs as paged_prefill_inputs
from tests.engine.kernels.test_paged_prefill_attention import reference as prefill_reference
from tests.engine.kernels.test_rms_norm import op_by_op, random_rows
from tests.engine.kernels.test_silu_and_mul import pytorch_silu_and_mul

CROSS_COMPILER = "aarch64-linux-gnu-gcc"
QEMU = "qemu-aarch64"
pytestmark = pytest.mark.skipif(
    shutil.which(CROSS_COMPILER) is None or shutil.which(QEMU) is None,
    reason=f"the aarch64 kernel tests need {CROSS_COMPILER} and {QEMU} "
    "(Debian: apt-get install gcc-aarch64-linux-gnu qemu-user; `make cross-toolchain`)",
)

DRIVER = Path(__file__).parent / "cross" / "kernel_driver.c"
NEON_LEVELS = tuple(level for level in ISA_LEVELS if level.machine == "aarch64")
# The CPU qemu emulates for a level: the oldest that has it (Cortex-A53: ARMv8.0-A; Neoverse
# N1: ARMv8.2-A with the dot-product instructions).
QEMU_CPUS = {"neon": "cortex-a53", "neon_dotprod": "neoverse-n1"}
THREADS = 2  # the kernels' OpenMP loops run in threads under qemu too
QEMU_TIMEOUT_S = 120

# Tolerances: the x86 tests' (conftest.assert_same_values, test_paged_decode_attention's).
# Measured here, float32: norm and SiLU at most 3.2e-7 relative from PyTorch, attention 6e-7.
# int4 and int8, as test_int4_linear and test_int8_linear bound them: bf16 outputs' rounding
# alone is ~1.7e-3; float32 outputs keep only the error of the int8 activation codes (measured
# here: int4 0.8e-4 to 1.2e-4, int8 4.6e-5 to 7.5e-5).
INT4_RELATIVE_ERROR = {torch.bfloat16: 2.5e-3, torch.float32: 5e-4}
INT8_RELATIVE_ERROR = {torch.bfloat16: 2.5e-3, torch.float32: 2e-4}
# The fused decode step (two layers) against PyTorch: the matmuls' errors, and in bf16 the
# roundings they flip, carried through both layers. Measured: 6.0e-3 (bf16), 9.1e-5 (float32).
DECODE_RELATIVE_ERROR = {torch.bfloat16: 2e-2, torch.float32: 1e-3}


@dataclass(frozen=True, slots=True)
class NeonBuild:
    """The driver program built for one level and activation type."""

    level: IsaLevel
    dtype: torch.dtype
    binary: Path
    compiler_output: str  # what the compiler printed for the sources (warnings)

    @property
    def name(self) -> str:
        return f"{self.level.name}-{ACTIVATIONS[self.dtype]}"

    def run(
        self,
        kernel: str,
        work_dir: Path,
        arrays: Mapping[str, torch.Tensor],
        outputs: Mapping[str, tuple[torch.dtype, tuple[int, ...]]],
        **sizes: float,
    ) -> dict[str, torch.Tensor]:
        """Run `kernel` under qemu on `arrays` (written to `work_dir`) with the sizes and float
        parameters `sizes`; the arrays `outputs` names, of their dtype and shape. Fails the
        test unless the kernel returned 0."""
        work_dir.mkdir(parents=True)
        for name, tensor in arrays.items():
            (work_dir / name).write_bytes(tensor_bytes(tensor))
        arguments = [
            f"{name}={value.hex() if isinstance(value, float) else value}"
            for name, value in {"threads": THREADS, **sizes}.items()
        ]
        command = [QEMU, "-cpu", QEMU_CPUS[self.level.name], str(self.binary), kernel]
        result = subprocess.run(
            [*command, str(work_dir), *arguments],
            capture_output=True,
            text=True,
            timeout=QEMU_TIMEOUT_S,
            check=False,
        )
        if result.returncode != 0:
            pytest.fail(
                f"{kernel} ({self.name}) exited with {result.returncode}: {result.stderr}",
                pytrace=False,
            )
        assert int(result.stdout) == 0, f"{kernel} ({self.name}) refused its arguments"
        return {
            name: read_tensor(work_dir / f"{name}.out", dtype, shape)
            for name, (dtype, shape) in outputs.items()
        }


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().flatten().view(torch.uint8).numpy().tobytes()


def read_tensor(path: Path, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.frombuffer(bytearray(path.read_bytes()), dtype=dtype).view(shape)


def driver_sources() -> list[Path]:
    """The sources the driver links: those of every kernel that runs at all levels
    (linear_bf16.c is x86 AMX only), less decode_layers.c, which the driver includes."""
    names = {
        name
        for spec in KERNELS.values()
        if spec.only_level is None
        for name in (spec.source, *spec.linked_sources)
    }
    return [SOURCE_DIR / name for name in sorted(names - {KERNELS["decode_layers"].source})]


def build_driver(directory: Path, level: IsaLevel, dtype: torch.dtype) -> NeonBuild:
    """Compile the kernels and the driver as kernels/__init__.py compiles a library for `level`
    and `dtype` (its flags, less -shared), with -Wall -Wextra; link them statically."""
    build_dir = directory / f"{level.name}-{ACTIVATIONS[dtype]}"
    build_dir.mkdir()
    flags = [
        *(flag for flag in COMPILE_FLAGS if flag != "-shared"),
        *level.compile_flags,
        *(["-DCACHET_ACTIVATION_FLOAT32"] if dtype == torch.float32 else []),
        "-Wall",
        "-Wextra",
        f"-I{SOURCE_DIR}",
    ]
    sources = [DRIVER, *driver_sources()]
    compiled = subprocess.run(
        [CROSS_COMPILER, *flags, "-c", *map(str, sources)],
        cwd=build_dir,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if compiled.returncode != 0:
        pytest.fail(f"{CROSS_COMPILER} {' '.join(flags)} failed:\n{compiled.stderr}")
    binary = build_dir / "kernel_driver"
    objects = [str(build_dir / f"{source.stem}.o") for source in sources]
    # NOTE: the static libgomp warns that its OpenACC profiling would dlopen; it is never used.
    linked = subprocess.run(
        [CROSS_COMPILER, "-fopenmp", "-static", "-o", str(binary), *objects, "-lm"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if linked.returncode != 0:
        pytest.fail(f"linking the aarch64 kernel driver failed:\n{linked.stderr}")
    return NeonBuild(level, dtype, binary, compiled.stderr)


def build_name(level: IsaLevel, dtype: torch.dtype) -> str:
    return f"{level.name}-{ACTIVATIONS[dtype]}"


@pytest.fixture(scope="session")
def neon_builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, NeonBuild]:
    """Every (level, activation type) build, by `build_name`; compiled in parallel (~9 s of
    compiler time each, most of it paged_decode_attention.c's instances)."""
    directory = tmp_path_factory.mktemp("neon")
    jobs = [(level, dtype) for level in NEON_LEVELS for dtype in ACTIVATIONS]
    with ThreadPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
        builds = list(pool.map(lambda job: build_driver(directory, *job), jobs))
    return {build.name: build for build in builds}


@pytest.fixture(params=NEON_LEVELS, ids=[level.name for level in NEON_LEVELS])
def neon(
    request: pytest.FixtureRequest, neon_builds: dict[str, NeonBuild], dtype: torch.dtype
) -> NeonBuild:
    """The build of each aarch64 level for each activation type (conftest's `dtype`)."""
    return neon_builds[build_name(request.param, dtype)]


def random(*shape: int, seed: int, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    """Normal values times `scale` in `dtype` (float32: full mantissas, none bf16 would hold)."""
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=generator) * scale).to(dtype)


# ---- the builds ---------------------------------------------------------------------------


def test_every_kernel_source_compiles_for_each_aarch64_level_without_warnings(neon_builds):
    assert KERNELS["decode_layers"].source == "decode_layers.c"  # kernel_driver.c includes it
    assert "linear_bf16.c" not in {path.name for path in driver_sources()}
    assert len(neon_builds) == len(NEON_LEVELS) * len(ACTIVATIONS) == 4
    for build in neon_builds.values():
        assert build.compiler_output == "", f"{build.name}:\n{build.compiler_output}"


def test_the_armv8_build_uses_no_dot_product_instruction_and_the_dotprod_build_does(
    neon_builds,
):
    # NOTE: Cortex-A53 has no sdot: a build that used it would stop with SIGILL under qemu.
    def disassembly(name: str) -> str:
        kernel = neon_builds[name].binary.parent / "int4_linear.o"
        return subprocess.run(
            ["aarch64-linux-gnu-objdump", "-d", str(kernel)],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout

    for level in NEON_LEVELS:
        uses_sdot = "\tsdot\t" in disassembly(build_name(level, torch.bfloat16))
        assert uses_sdot == ("asimddp" in level.required_cpu_flags), level.name


# ---- one kernel at a time -----------------------------------------------------------------


@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize(("rows", "hidden"), [(3, 128), (64, 64)])  # 64 rows: OpenMP threads
def test_the_neon_rms_norm_computes_transformers_op_by_op_norm_under_qemu(
    neon, tmp_path, rows, hidden, with_residual
):
    x, residual, weight = random_rows(rows, hidden, seed=rows, dtype=neon.dtype)
    arrays = {"x": x, "weight": weight, **({"residual": residual} if with_residual else {})}
    outputs = {"out": (neon.dtype, (rows, hidden))}
    if with_residual:
        outputs["residual"] = (neon.dtype, (rows, hidden))
    result = neon.run(
        "rms_norm", tmp_path / "run", arrays, outputs, rows=rows, hidden=hidden, eps=1e-5
    )

    normed_input = residual + x if with_residual else x
    if with_residual:  # stored in place, rounded to the activation type: bitwise both ways
        assert torch.equal(result["residual"], normed_input)
    assert_same_values(result["out"], op_by_op(normed_input, weight, 1e-5))


@pytest.mark.parametrize("rows", [1, 16])  # 16 rows: OpenMP threads
def test_the_neon_silu_and_mul_computes_pytorchs_silu_times_up_under_qemu(neon, tmp_path, rows):
    gate_up = random(rows, 2 * 96, seed=rows, dtype=neon.dtype, scale=3)
    result = neon.run(
        "silu_and_mul",
        tmp_path / "run",
        {"gate_up": gate_up},
        {"out": (neon.dtype, (rows, 96))},
        rows=rows,
        width=96,
    )
    assert_same_values(result["out"], pytorch_silu_and_mul(gate_up))


def test_large_gates_saturate_in_the_neon_silu_as_in_pytorch(neon, tmp_path):
    gate = torch.tensor([-1e4, -200.0, -90.0, -20.0, 0.0, 20.0, 90.0, 1e4] * 2)
    gate_up = torch.cat((gate, torch.full((16,), 1.5))).to(neon.dtype).unsqueeze(0)
    result = neon.run(
        "silu_and_mul",
        tmp_path / "run",
        {"gate_up": gate_up},
        {"out": (neon.dtype, (1, 16))},
        rows=1,
        width=16,
    )
    assert_same_values(result["out"], pytorch_silu_and_mul(gate_up))


@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim"), [(6, 2, 64), (2, 1, 128)])
@pytest.mark.parametrize("query_lens", [[1, 1, 1], [1, 34]])  # 35 tokens: OpenMP threads
def test_the_neon_rotation_and_cache_write_are_bitwise_the_pytorch_ops_under_qemu(
    neon, tmp_path, num_heads, num_kv_heads, head_dim, query_lens
):
    num_tokens, block_size = sum(query_lens), 16
    qkv = random(
        num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, seed=3, dtype=neon.dtype, scale=2
    )
    tables = [list(range(4 * i, 4 * i + 4)) for i in range(len(query_lens))]
    computed = [5 + 20 * i for i in range(len(query_lens))]
    metadata = build_attention_metadata(
        query_lens, computed, tables, block_size=block_size, num_kv_heads=num_kv_heads
    )
    cos, sin = RotaryEmbedding(RopeArgs(theta=10000.0), head_dim)(metadata.positions, neon.dtype)
    shape = (4 * len(query_lens), num_kv_heads, block_size, head_dim)
    k_cache = random(*shape, seed=4, dtype=neon.dtype)  # rows not written must stay as they are
    v_cache = random(*shape, seed=5, dtype=neon.dtype)
    result = neon.run(
        "rotary_store",
        tmp_path / "run",
        {
            "qkv": qkv,
            "cos": cos,
            "sin": sin,
            "k_cache": k_cache,
            "v_cache": v_cache,
            "write_index": metadata.write_index,
        },
        {
            "q_out": (neon.dtype, (num_tokens, num_heads, head_dim)),
            "k_out": (neon.dtype, (num_tokens, num_kv_heads, head_dim)),
            "k_cache": (neon.dtype, shape),
            "v_cache": (neon.dtype, shape),
        },
        tokens=num_tokens,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        cache_rows=k_cache.numel() // head_dim,
    )

    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    qk = apply_rotary(qkv[:, : q_size + kv_size].view(num_tokens, -1, head_dim), cos, sin)
    expected_k = qk[:, num_heads:]
    assert torch.equal(result["q_out"], qk[:, :num_heads])
    assert torch.equal(result["k_out"], expected_k)
    expected_v = qkv[:, q_size + kv_size :].reshape(-1, head_dim)
    k_cache.view(-1, head_dim).index_copy_(
        0, metadata.write_index, expected_k.reshape(-1, head_dim)
    )
    v_cache.view(-1, head_dim).index_copy_(0, metadata.write_index, expected_v)
    assert torch.equal(result["k_cache"], k_cache) and torch.equal(result["v_cache"], v_cache)


@dataclass(frozen=True, slots=True)
class QuantizedWeight:
    """A weight in the format of a native matmul, and the float32 weights it stands for."""

    kernel: str  # "int4_linear" or "int8_linear"
    # the kernel's arrays: codes (rows padded to 64), scales (and int4's zero_points)
    parts: dict[str, torch.Tensor]
    dequantized: torch.Tensor  # [out_features, in_features] float32
    group_size: int = 0  # int4's

    def arrays(self, name: str) -> dict[str, torch.Tensor]:
        """The driver's arrays NAME.codes, NAME.scales, ..."""
        return {f"{name}.{part}": tensor for part, tensor in self.parts.items()}


def int4_weight(weight: torch.Tensor, group_size: int) -> QuantizedWeight:
    """`weight` [out, in] quantized as Int4Linear does natively (rows padded to 64 with zeros):
    w = s (q - z / 16) per group."""
    out_features, in_features = weight.shape
    rows = math.ceil(out_features / 64) * 64
    padded = torch.cat((weight.float(), weight.new_zeros(rows - out_features, in_features)))
    codes, scales, zero_points = quantize_int4_vnni(padded.view(rows, -1, group_size))
    offsets = zero_points.T.float()[..., None] / 16
    dequantized = (codes.float() - offsets) * scales.T.float()[..., None]
    return QuantizedWeight(
        "int4_linear",
        {
            "codes": pack_int4_vnni(codes.view(rows, -1)),
            "scales": scales,
            "zero_points": zero_points,
        },
        dequantized.view(rows, in_features)[:out_features],
        group_size,
    )


def int8_weight(weight: torch.Tensor, dtype: torch.dtype) -> QuantizedWeight:
    """`weight` [out, in] quantized as Int8Linear does natively: w = s q, one scale per row in
    `dtype` (padded rows: zero codes, zero scales)."""
    codes, scales = quantize_rows_int8(weight, dtype)
    padded_scales = scales.new_zeros(padded_rows(len(scales)))
    padded_scales[: len(scales)] = scales
    return QuantizedWeight(
        "int8_linear",
        {"codes": pack_int8(codes), "scales": padded_scales},
        codes.float() * scales.float()[:, None],
    )


def run_matmul(
    build: NeonBuild, work_dir: Path, x: torch.Tensor, weight: QuantizedWeight
) -> torch.Tensor:
    (num_tokens, in_features), out_features = x.shape, weight.dequantized.shape[0]
    group = {"group_size": weight.group_size} if weight.group_size else {}
    result = build.run(
        weight.kernel,
        work_dir,
        {"x": x, **weight.arrays("weight")},
        {"out": (build.dtype, (num_tokens, out_features))},
        m=num_tokens,
        n=out_features,
        padded_n=weight.parts["codes"].shape[0],
        k=in_features,
        **group,
    )
    return result["out"]


def assert_matmul_matches_at_both_levels(
    neon_builds: dict[str, NeonBuild],
    work_dir: Path,
    weight: QuantizedWeight,
    num_tokens: int,
    dtype: torch.dtype,
    bound: float,
) -> None:
    """The kernel's x W^T against the dequantized weights in float32, within `bound` (relative
    error), at every level; and the same bits at every level: the integer dot products are
    exact (sdot, or widening multiplies)."""
    in_features = weight.dequantized.shape[1]
    x = random(num_tokens, in_features, seed=1, dtype=torch.float32)
    x[:, 5] = 40.0  # an outlier activation shares its block with small values
    x = x.to(dtype)
    expected = x.float() @ weight.dequantized.T
    results = []
    for level in NEON_LEVELS:
        build = neon_builds[build_name(level, dtype)]
        results.append(run_matmul(build, work_dir / level.name, x, weight))
        error = relative_error(results[-1], expected)
        assert error < bound, f"{build.name}: relative error {error:.2e}"
    first, *others = results
    assert all(torch.equal(first, other) for other in others)


@pytest.mark.parametrize(
    ("out_features", "in_features", "group_size", "num_tokens"),
    [(192, 256, 32, 1), (100, 128, 64, 3), (64, 32, 32, 5)],
)
def test_the_neon_int4_matmul_matches_the_dequantized_weights_at_both_levels_under_qemu(
    neon_builds, tmp_path, dtype, out_features, in_features, group_size, num_tokens
):
    weight = random(out_features, in_features, seed=out_features, dtype=torch.float32, scale=0.05)
    assert_matmul_matches_at_both_levels(
        neon_builds,
        tmp_path,
        int4_weight(weight, group_size),
        num_tokens,
        dtype,
        INT4_RELATIVE_ERROR[dtype],
    )


@pytest.mark.parametrize("bits", [4, 8])
def test_the_neon_dequantization_gives_pytorchs_values_transposed_under_qemu(
    neon_builds, tmp_path, dtype, bits
):
    out_features, in_features, group_size, row0 = 200, 128, 64, 64
    floats = random(out_features, in_features, seed=bits, dtype=torch.float32, scale=0.05)
    weight = int4_weight(floats, group_size) if bits == 4 else int8_weight(floats.to(dtype), dtype)
    num_rows = out_features - row0  # ends inside a tile
    expected = weight.dequantized[row0:].to(dtype).T
    group = {"group_size": group_size} if bits == 4 else {}
    for level in NEON_LEVELS:
        result = neon_builds[build_name(level, dtype)].run(
            f"int{bits}_dequantize",
            tmp_path / level.name,
            weight.arrays("weight"),
            {"out": (dtype, (in_features, num_rows))},
            row0=row0,
            num_rows=num_rows,
            padded_n=weight.parts["codes"].shape[0],
            k=in_features,
            **group,
        )
        assert torch.equal(result["out"], expected)


@pytest.mark.parametrize(
    ("out_features", "in_features", "num_tokens"), [(192, 256, 1), (100, 128, 3), (64, 32, 5)]
)
def test_the_neon_int8_matmul_matches_the_dequantized_weights_at_both_levels_under_qemu(
    neon_builds, tmp_path, dtype, out_features, in_features, num_tokens
):
    weight = random(out_features, in_features, seed=out_features, dtype=torch.float32, scale=0.05)
    weight[:, 3] = 0.4  # a column of outliers: rows span the whole int8 range
    assert_matmul_matches_at_both_levels(
        neon_builds,
        tmp_path,
        int8_weight(weight.to(dtype), dtype),
        num_tokens,
        dtype,
        INT8_RELATIVE_ERROR[dtype],
    )


@pytest.mark.parametrize(
    ("group", "head_dim", "block_size"),
    [(1, 64, 16), (3, 64, 32), (2, 128, 16), (5, 96, 16)],  # head_dim 96: the generic instance
)
def test_the_neon_paged_decode_attention_matches_exact_softmax_attention_under_qemu(
    neon, tmp_path, group, head_dim, block_size
):
    num_kv_heads, num_blocks = 2, 40
    # 1 token, a partial first tile, exactly one block, one past a block, a long context
    context_lens = [1, 7, block_size, block_size + 1, 300]
    generator = torch.Generator().manual_seed(group)
    tables = scattered_block_tables(context_lens, block_size, num_blocks, generator)
    k_cache, v_cache = random_cache(
        num_blocks, num_kv_heads, block_size, head_dim, seed=group, dtype=neon.dtype
    )
    # rows past each context (and unused blocks) hold NaN: the kernel must never read them
    valid = torch.zeros(num_blocks, block_size, dtype=torch.bool)
    for table, length in zip(tables, context_lens, strict=True):
        rows = torch.tensor(table)[:, None] * block_size + torch.arange(block_size)
        valid.view(-1)[rows.flatten()[:length]] = True
    k_cache.transpose(1, 2)[~valid] = float("nan")
    v_cache.transpose(1, 2)[~valid] = float("nan")
    num_seqs = len(context_lens)
    q = random(num_seqs, num_kv_heads, group, head_dim, seed=3, dtype=neon.dtype)
    width = max(len(table) for table in tables)
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    blocks_per_part, num_parts = context_partitions(num_seqs, num_kv_heads, width, THREADS)
    assert num_parts > 1  # the long context is split, and merged by log-sum-exp
    scale = head_dim**-0.5
    result = neon.run(
        "paged_decode_attention",
        tmp_path / "run",
        {
            "q": q,
            "k_cache": k_cache,
            "v_cache": v_cache,
            "block_tables": block_tables,
            "context_lens": torch.tensor(context_lens, dtype=torch.int32),
        },
        {
            "out": (torch.float32, tuple(q.shape)),
            "lse": (torch.float32, tuple(q.shape[:-1])),
        },
        num_seqs=num_seqs,
        num_kv_heads=num_kv_heads,
        group=group,
        head_dim=head_dim,
        block_size=block_size,
        num_blocks=num_blocks,
        table_stride=width,
        tokens_per_part=blocks_per_part * block_size,
        num_parts=num_parts,
        scale=scale,
    )
    expected, expected_lse = attention_reference(q, k_cache, v_cache, tables, context_lens, scale)
    assert not result["out"].isnan().any()
    assert torch.allclose(result["out"].double(), expected, atol=tolerance(neon.dtype), rtol=0)
    assert torch.allclose(result["lse"].double(), expected_lse, atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim", "num_cached", "num_queries"),
    [(9, 3, 64, 100, 40), (12, 2, 128, 37, 20), (4, 4, 96, 20, 9)],  # 96: the generic instance
)
def test_the_neon_paged_prefill_attention_matches_exact_softmax_attention_under_qemu(
    neon, tmp_path, num_heads, num_kv_heads, head_dim, num_cached, num_queries
):
    if neon.dtype != torch.float32:
        pytest.skip("in bf16 the prefill kernel serves AVX-512 BF16 CPUs only")
    context_len = num_cached + num_queries
    q, k_cache, v_cache, table = paged_prefill_inputs(
        num_heads, num_kv_heads, head_dim, context_len, num_queries, seed=head_dim,
        dtype=torch.float32,
    )  # fmt: skip
    positions = torch.arange(num_cached, context_len, dtype=torch.int32)
    result = neon.run(
        "paged_prefill_attention",
        tmp_path / "run",
        {"q": q, "k_cache": k_cache, "v_cache": v_cache, "block_table": table,
         "positions": positions},
        {"out": (torch.float32, tuple(q.shape))},
        num_tokens=num_queries,
        num_kv_heads=num_kv_heads,
        group=num_heads // num_kv_heads,
        head_dim=head_dim,
        block_size=k_cache.shape[2],
        num_blocks=k_cache.shape[0],
        table_len=len(table),
        tokens_per_item=8,  # several work items per KV head: the OpenMP loop's threads
        scale=0.125,
    )  # fmt: skip
    expected = prefill_reference(q, k_cache, v_cache, table, positions, 0.125)
    assert not result["out"].isnan().any()  # the NaN rows past the context were never read
    assert torch.allclose(result["out"].double(), expected, **FLOAT32_PREFILL_TOLERANCE)


# ---- every layer of a decode step in one call ---------------------------------------------


@dataclass(frozen=True, slots=True)
class TinyLayer:
    """One Llama decoder layer whose linear layers are int4 and int8 (as a GGUF Q4_K_M model's:
    the fused decode without AMX)."""

    input_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv: QuantizedWeight
    qkv_bias: torch.Tensor  # Qwen2-style: the one linear layer with a bias
    o: QuantizedWeight
    gate_up: QuantizedWeight
    down: QuantizedWeight


HIDDEN, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, INTERMEDIATE = 128, 4, 2, 64, 192
GROUP_SIZE, BLOCK_SIZE, NUM_BLOCKS, EPS = 32, 16, 12, 1e-5


def tiny_layer(index: int, dtype: torch.dtype) -> TinyLayer:
    def linear(
        out_features: int, in_features: int, seed: int, int8: bool = False
    ) -> QuantizedWeight:
        scale = in_features**-0.5
        weight = random(out_features, in_features, seed=seed, dtype=torch.float32, scale=scale)
        return int8_weight(weight.to(dtype), dtype) if int8 else int4_weight(weight, GROUP_SIZE)

    def norm(seed: int) -> torch.Tensor:
        return (random(HIDDEN, seed=seed, dtype=torch.float32, scale=0.1) + 1).to(dtype)

    qkv_size = (NUM_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM
    seed = 10 * index
    return TinyLayer(
        input_norm=norm(seed),
        post_norm=norm(seed + 1),
        qkv=linear(qkv_size, HIDDEN, seed + 2),
        qkv_bias=random(qkv_size, seed=seed + 3, dtype=dtype, scale=0.1),
        o=linear(HIDDEN, NUM_HEADS * HEAD_DIM, seed + 4, int8=True),
        gate_up=linear(2 * INTERMEDIATE, HIDDEN, seed + 5),
        down=linear(HIDDEN, INTERMEDIATE, seed + 6, int8=index == 1),
    )


def reference_linear(
    x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """The dequantized weights in float32, rounded to x's dtype; then the bias added there."""
    y = (x.float() @ weight.dequantized.T).to(x.dtype)
    return y if bias is None else y + bias


def reference_decode_step(
    layers: list[TinyLayer],
    x: torch.Tensor,
    caches: list[tuple[torch.Tensor, torch.Tensor]],
    cos: torch.Tensor,
    sin: torch.Tensor,
    write_index: torch.Tensor,
    tables: list[list[int]],
    context_lens: list[int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """decode_layers.c's step in PyTorch ops (the caches updated in place): (the last layer's
    MLP output, the residual stream)."""
    num_tokens, q_size = x.shape[0], NUM_HEADS * HEAD_DIM
    residual = x
    for index, (layer, (k_cache, v_cache)) in enumerate(zip(layers, caches, strict=True)):
        if index:
            residual = residual + x
        qkv = reference_linear(op_by_op(residual, layer.input_norm, EPS), layer.qkv, layer.qkv_bias)
        q_and_k = qkv[:, : q_size + NUM_KV_HEADS * HEAD_DIM].view(num_tokens, -1, HEAD_DIM)
        rotated = apply_rotary(q_and_k, cos, sin)
        values = qkv[:, q_size + NUM_KV_HEADS * HEAD_DIM :].reshape(-1, HEAD_DIM)
        k_cache.view(-1, HEAD_DIM).index_copy_(
            0, write_index, rotated[:, NUM_HEADS:].reshape(-1, HEAD_DIM)
        )
        v_cache.view(-1, HEAD_DIM).index_copy_(0, write_index, values)
        grouped_q = rotated[:, :NUM_HEADS].reshape(num_tokens, NUM_KV_HEADS, -1, HEAD_DIM)
        attention, _ = attention_reference(
            grouped_q, k_cache, v_cache, tables, context_lens, HEAD_DIM**-0.5
        )
        x = reference_linear(attention.float().to(x.dtype).view(num_tokens, q_size), layer.o)
        residual = residual + x
        gate_up = reference_linear(op_by_op(residual, layer.post_norm, EPS), layer.gate_up)
        x = reference_linear(pytorch_silu_and_mul(gate_up), layer.down)
    return x, residual


def test_the_neon_fused_decode_step_computes_the_pytorch_layers_under_qemu(neon, tmp_path):
    layers = [tiny_layer(index, neon.dtype) for index in range(2)]
    computed = [4, 37]  # tokens already cached; this step adds one to each
    tables = [[3, 7, 1], [0, 9, 4, 11]]
    metadata = build_attention_metadata(
        [1, 1],
        computed,
        tables,
        block_size=BLOCK_SIZE,
        num_kv_heads=NUM_KV_HEADS,
        decode_kernel=True,
        cascade=False,
    )
    assert metadata.decode_block_table is not None and metadata.decode_context_lens is not None
    cos, sin = RotaryEmbedding(RopeArgs(theta=10000.0), HEAD_DIM)(metadata.positions, neon.dtype)
    x = random(2, HIDDEN, seed=99, dtype=neon.dtype)
    cache_shape = (NUM_BLOCKS, NUM_KV_HEADS, BLOCK_SIZE, HEAD_DIM)
    caches = [
        random_cache(NUM_BLOCKS, NUM_KV_HEADS, BLOCK_SIZE, HEAD_DIM, seed=50 + i, dtype=neon.dtype)
        for i in range(len(layers))
    ]
    arrays = {
        "x": x,
        "cos": cos,
        "sin": sin,
        "write_index": metadata.write_index,
        "block_tables": metadata.decode_block_table,
        "context_lens": metadata.decode_context_lens,
    }
    for index, (layer, (k_cache, v_cache)) in enumerate(zip(layers, caches, strict=True)):
        arrays |= {
            f"{index}.input_norm": layer.input_norm,
            f"{index}.post_norm": layer.post_norm,
            **layer.qkv.arrays(f"{index}.qkv"),
            f"{index}.qkv.bias": layer.qkv_bias,
            **layer.o.arrays(f"{index}.o"),
            **layer.gate_up.arrays(f"{index}.gate_up"),
            **layer.down.arrays(f"{index}.down"),
            f"{index}.k_cache": k_cache,
            f"{index}.v_cache": v_cache,
        }
    outputs: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {
        "x": (neon.dtype, (2, HIDDEN)),
        "residual": (neon.dtype, (2, HIDDEN)),
    }
    for index in range(len(layers)):
        outputs[f"{index}.k_cache"] = (neon.dtype, cache_shape)
        outputs[f"{index}.v_cache"] = (neon.dtype, cache_shape)
    table_stride = metadata.decode_block_table.shape[1]
    blocks_per_part, num_parts = context_partitions(2, NUM_KV_HEADS, table_stride, THREADS)
    result = neon.run(
        "decode_layers",
        tmp_path / "run",
        arrays,
        outputs,
        num_layers=len(layers),
        hidden=HIDDEN,
        num_heads=NUM_HEADS,
        num_kv_heads=NUM_KV_HEADS,
        head_dim=HEAD_DIM,
        intermediate=INTERMEDIATE,
        block_size=BLOCK_SIZE,
        eps=EPS,
        scale=HEAD_DIM**-0.5,
        group_size=GROUP_SIZE,
        num_blocks=NUM_BLOCKS,
        m=2,
        table_stride=table_stride,
        tokens_per_part=blocks_per_part * BLOCK_SIZE,
        num_parts=num_parts,
    )

    context_lens = metadata.decode_context_lens.tolist()
    expected_x, expected_residual = reference_decode_step(
        layers, x, caches, cos, sin, metadata.write_index, tables, context_lens
    )
    # NOTE: not bitwise: each matmul quantizes its activations to int8 codes (see
    # INT4_RELATIVE_ERROR), and those errors travel through both layers.
    bound = DECODE_RELATIVE_ERROR[neon.dtype]
    assert relative_error(result["x"], expected_x.float()) < bound
    assert relative_error(result["residual"], expected_residual.float()) < bound
    for index, (k_cache, v_cache) in enumerate(caches):
        written = metadata.write_index
        for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
            actual = result[f"{index}.{name}"].view(-1, HEAD_DIM)
            expected = cache.view(-1, HEAD_DIM)
            assert relative_error(actual[written], expected[written].float()) < bound
            unwritten = torch.ones(len(expected), dtype=torch.bool)
            unwritten[written] = False
            assert torch.equal(actual[unwritten], expected[unwritten])
