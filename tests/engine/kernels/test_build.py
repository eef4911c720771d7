"""Native kernels: built once per machine with the system C compiler, cached, optional."""

from __future__ import annotations

import logging
import os
import shutil

import pytest
import torch

from inference.engine import BatchEntry, EngineConfig, ModelRunner
from inference.engine import kernels as native_kernels
from inference.engine.kernels import KERNELS, load_kernel
from inference.engine.layers.linear import AmxLinear

KERNEL = "paged_decode_attention"
AVX2 = next(level for level in native_kernels.ISA_LEVELS if level.name == "avx2")
needs_cpu = pytest.mark.skipif(
    native_kernels.isa_level() is None or shutil.which(os.environ.get("CC") or "cc") is None,
    reason="needs a CPU with AVX2, AVX-512 or NEON and a C compiler",
)


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty kernel cache directory, and load_kernel's per-process memo cleared."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    native_kernels.forget_loaded_kernels()
    yield tmp_path / "cachet" / "kernels"
    native_kernels.forget_loaded_kernels()


@needs_cpu
def test_a_kernel_is_compiled_into_the_cache_once_and_then_reused(fresh_cache):
    library = load_kernel(KERNEL)
    assert library is not None
    assert hasattr(library, "paged_decode_attention")
    [built] = fresh_cache.glob("paged_decode_attention-*.so")
    built_at = built.stat().st_mtime_ns
    native_kernels.forget_loaded_kernels()
    assert load_kernel(KERNEL) is not None
    assert [p.name for p in fresh_cache.iterdir()] == [built.name]  # no temporary leftovers
    assert built.stat().st_mtime_ns == built_at


@needs_cpu
def test_a_changed_source_gets_a_library_of_its_own(fresh_cache, tmp_path, monkeypatch):
    assert load_kernel(KERNEL) is not None
    source_dir = shutil.copytree(native_kernels.SOURCE_DIR, tmp_path / "csrc")
    with open(source_dir / KERNELS[KERNEL].source, "a") as source:
        source.write("\n/* changed */\n")
    monkeypatch.setattr(native_kernels, "SOURCE_DIR", source_dir)
    native_kernels.forget_loaded_kernels()
    assert load_kernel(KERNEL) is not None
    assert len(list(fresh_cache.glob("paged_decode_attention-*.so"))) == 2


@needs_cpu
def test_a_changed_header_rebuilds_the_kernels_too(fresh_cache, tmp_path, monkeypatch):
    assert load_kernel(KERNEL) is not None
    source_dir = shutil.copytree(native_kernels.SOURCE_DIR, tmp_path / "csrc")
    with open(source_dir / "simd.h", "a") as header:
        header.write("\n/* changed */\n")
    monkeypatch.setattr(native_kernels, "SOURCE_DIR", source_dir)
    native_kernels.forget_loaded_kernels()
    assert load_kernel(KERNEL) is not None
    assert len(list(fresh_cache.glob("paged_decode_attention-*.so"))) == 2


def test_without_a_compiler_the_kernel_is_unavailable_and_the_log_says_why(
    fresh_cache, monkeypatch, caplog
):
    monkeypatch.setattr(native_kernels, "cpu_flags", lambda: frozenset(AVX2.required_cpu_flags))
    monkeypatch.setattr(native_kernels, "machine", lambda: "x86_64")
    monkeypatch.setenv("CC", "no-such-compiler-cachet")
    with caplog.at_level(logging.WARNING, logger="inference.engine.kernels"):
        assert load_kernel(KERNEL) is None
    assert "no C compiler 'no-such-compiler-cachet'" in caplog.text


def test_a_source_that_does_not_compile_leaves_no_library_behind(
    fresh_cache, tmp_path, monkeypatch, caplog
):
    monkeypatch.setattr(native_kernels, "cpu_flags", lambda: frozenset(AVX2.required_cpu_flags))
    monkeypatch.setattr(native_kernels, "machine", lambda: "x86_64")
    source_dir = tmp_path / "broken"
    source_dir.mkdir()
    (source_dir / KERNELS[KERNEL].source).write_text("int broken( {\n")
    monkeypatch.setattr(native_kernels, "SOURCE_DIR", source_dir)
    with caplog.at_level(logging.WARNING, logger="inference.engine.kernels"):
        assert load_kernel(KERNEL) is None
    assert "failed on paged_decode_attention.c" in caplog.text
    assert list(fresh_cache.glob("*.so")) == []


def test_a_cpu_without_the_needed_instructions_gets_no_kernel(fresh_cache, monkeypatch):
    monkeypatch.setattr(native_kernels, "cpu_flags", lambda: frozenset(["sse4_2", "avx"]))
    monkeypatch.setattr(native_kernels, "machine", lambda: "x86_64")
    assert native_kernels.isa_level() is None
    assert load_kernel(KERNEL) is None
    assert not fresh_cache.exists()  # nothing was built


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (AVX2.required_cpu_flags, ["avx2"]),
        (
            (*AVX2.required_cpu_flags, "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"),
            ["avx512", "avx2"],
        ),
        (
            (*AVX2.required_cpu_flags, "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl",
             "avx512_vnni"),
            ["avx512_vnni", "avx512", "avx2"],
        ),
        (
            (*AVX2.required_cpu_flags, "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl",
             "avx512_bf16", "avx512_vnni"),
            ["avx512_bf16", "avx512_vnni", "avx512", "avx2"],
        ),
        (("avx2",), []),  # no FMA / F16C / BMI: not x86-64-v3
    ],
)  # fmt: skip
def test_the_best_level_the_cpu_flags_allow_is_chosen_and_lower_ones_can_be_forced(
    monkeypatch, flags, expected
):
    monkeypatch.setattr(native_kernels, "cpu_flags", lambda: frozenset(flags))
    monkeypatch.setattr(native_kernels, "machine", lambda: "x86_64")
    monkeypatch.delenv(native_kernels.ISA_ENVIRONMENT_VARIABLE, raising=False)
    assert [level.name for level in native_kernels.supported_isa_levels()] == expected
    chosen = native_kernels.isa_level()
    assert (chosen.name if chosen else None) == (expected[0] if expected else None)
    for name in expected:
        monkeypatch.setenv(native_kernels.ISA_ENVIRONMENT_VARIABLE, name)
        forced = native_kernels.isa_level()
        assert forced is not None and forced.name == name


def test_an_aarch64_cpu_gets_neon_with_dot_products_where_it_has_them(monkeypatch):
    monkeypatch.setattr(native_kernels, "machine", lambda: "aarch64")
    monkeypatch.delenv(native_kernels.ISA_ENVIRONMENT_VARIABLE, raising=False)
    monkeypatch.setattr(native_kernels, "cpu_flags", lambda: frozenset(["fp", "asimd", "asimddp"]))
    assert [level.name for level in native_kernels.supported_isa_levels()] == [
        "neon_dotprod",
        "neon",
    ]
    monkeypatch.setattr(native_kernels, "cpu_flags", lambda: frozenset(["fp", "asimd"]))
    chosen = native_kernels.isa_level()
    assert chosen is not None and chosen.name == "neon"


def test_a_forced_level_the_cpu_lacks_or_that_does_not_exist_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(native_kernels, "cpu_flags", lambda: frozenset(AVX2.required_cpu_flags))
    monkeypatch.setattr(native_kernels, "machine", lambda: "x86_64")
    monkeypatch.setenv(native_kernels.ISA_ENVIRONMENT_VARIABLE, "avx512")
    with pytest.raises(ValueError, match="'avx512': this CPU cannot run it; it can run avx2"):
        native_kernels.isa_level()
    monkeypatch.setenv(native_kernels.ISA_ENVIRONMENT_VARIABLE, "sse9")
    with pytest.raises(ValueError, match="'sse9' is not an instruction set level; use one of"):
        native_kernels.isa_level()


@needs_cpu
def test_each_level_and_activation_type_gets_a_library_of_its_own(fresh_cache, isa_level):
    for activation in ("bf16", "float32"):
        assert load_kernel("rms_norm", activation) is not None
    names = sorted(path.name.rsplit("-", 1)[0] for path in fresh_cache.glob("rms_norm-*.so"))
    assert names == [f"rms_norm-{isa_level}-bf16", f"rms_norm-{isa_level}-float32"]


@pytest.mark.parametrize("quantization", ["none", "int8", "int4"])
def test_a_runner_configured_without_native_kernels_builds_none_and_runs_pytorch_only(
    fresh_cache, tiny_model_dir, quantization
):
    config = EngineConfig(
        tiny_model_dir("llama"),
        dtype=torch.bfloat16,
        kv_cache_mb=1,
        block_size=16,
        max_model_len=64,
        quantization=quantization,
        native_kernels=False,
    )
    runner = ModelRunner(config)
    runner.execute([BatchEntry(list(range(3, 40)), 0, [0, 1, 2])])
    runner.execute([BatchEntry([7], 37, [0, 1, 2])])
    assert not fresh_cache.exists()  # nothing was built (or loaded)
    assert not runner.uses_decode_kernel and runner.model.fused_decode is None
    assert not runner.uses_prefill_kernel
    modules = list(runner.model.modules())
    assert not any(isinstance(module, AmxLinear) for module in modules)
    assert not any(getattr(module, "is_native", False) for module in modules)  # int4 layers
    assert not any(getattr(module, "native_kernels", False) for module in modules)


@needs_cpu
def test_preload_builds_every_kernel_the_cpu_can_run(fresh_cache):
    loaded = native_kernels.preload()
    assert "paged_decode_attention" in loaded and "rms_norm" in loaded
    level = native_kernels.isa_level()
    assert level is not None
    expected = [
        name
        for name, spec in KERNELS.items()
        if spec.only_level in (None, level.name)
        and set(spec.required_cpu_flags) <= native_kernels.cpu_flags()
    ]
    assert loaded == expected
    assert len(list(fresh_cache.glob("*.so"))) == len(expected)
