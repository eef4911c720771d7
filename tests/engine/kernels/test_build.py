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
ALL_NEEDED_FLAGS = frozenset(KERNELS[KERNEL].required_cpu_flags)
needs_cpu = pytest.mark.skipif(
    not set(KERNELS[KERNEL].required_cpu_flags) <= native_kernels.cpu_flags()
    or shutil.which(os.environ.get("CC") or "cc") is None,
    reason=f"needs a CPU with {KERNELS[KERNEL].required_cpu_flags} and a C compiler",
)


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty kernel cache directory, and load_kernel's per-process memo cleared."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    load_kernel.cache_clear()
    yield tmp_path / "cachet" / "kernels"
    load_kernel.cache_clear()


@needs_cpu
def test_a_kernel_is_compiled_into_the_cache_once_and_then_reused(fresh_cache):
    library = load_kernel(KERNEL)
    assert library is not None
    assert hasattr(library, "paged_decode_attention_bf16")
    [built] = fresh_cache.glob("paged_decode_attention-*.so")
    built_at = built.stat().st_mtime_ns
    load_kernel.cache_clear()
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
    load_kernel.cache_clear()
    assert load_kernel(KERNEL) is not None
    assert len(list(fresh_cache.glob("paged_decode_attention-*.so"))) == 2


@needs_cpu
def test_a_changed_header_rebuilds_the_kernels_too(fresh_cache, tmp_path, monkeypatch):
    assert load_kernel(KERNEL) is not None
    source_dir = shutil.copytree(native_kernels.SOURCE_DIR, tmp_path / "csrc")
    with open(source_dir / "bf16.h", "a") as header:
        header.write("\n/* changed */\n")
    monkeypatch.setattr(native_kernels, "SOURCE_DIR", source_dir)
    load_kernel.cache_clear()
    assert load_kernel(KERNEL) is not None
    assert len(list(fresh_cache.glob("paged_decode_attention-*.so"))) == 2


def test_without_a_compiler_the_kernel_is_unavailable_and_the_log_says_why(
    fresh_cache, monkeypatch, caplog
):
    monkeypatch.setattr(native_kernels, "cpu_flags", lambda: ALL_NEEDED_FLAGS)
    monkeypatch.setenv("CC", "no-such-compiler-cachet")
    with caplog.at_level(logging.WARNING, logger="inference.engine.kernels"):
        assert load_kernel(KERNEL) is None
    assert "no C compiler 'no-such-compiler-cachet'" in caplog.text


def test_a_source_that_does_not_compile_leaves_no_library_behind(
    fresh_cache, tmp_path, monkeypatch, caplog
):
    monkeypatch.setattr(native_kernels, "cpu_flags", lambda: ALL_NEEDED_FLAGS)
    source_dir = tmp_path / "broken"
    source_dir.mkdir()
    (source_dir / KERNELS[KERNEL].source).write_text("int broken( {\n")
    monkeypatch.setattr(native_kernels, "SOURCE_DIR", source_dir)
    with caplog.at_level(logging.WARNING, logger="inference.engine.kernels"):
        assert load_kernel(KERNEL) is None
    assert "failed on paged_decode_attention.c" in caplog.text
    assert list(fresh_cache.glob("*.so")) == []


def test_a_cpu_without_the_needed_instructions_gets_no_kernel(fresh_cache, monkeypatch):
    monkeypatch.setattr(native_kernels, "cpu_flags", lambda: frozenset(["avx2"]))
    assert load_kernel(KERNEL) is None
    assert not fresh_cache.exists()  # nothing was built


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
    modules = list(runner.model.modules())
    assert not any(isinstance(module, AmxLinear) for module in modules)
    assert not any(getattr(module, "is_native", False) for module in modules)  # int4 layers
    assert not any(getattr(module, "native_kernels", False) for module in modules)


@needs_cpu
def test_preload_builds_every_kernel_the_cpu_can_run(fresh_cache):
    loaded = native_kernels.preload()
    assert "paged_decode_attention" in loaded and "rms_norm" in loaded
    expected = [
        name
        for name, spec in KERNELS.items()
        if set(spec.required_cpu_flags) <= native_kernels.cpu_flags()
    ]
    assert loaded == expected
    assert len(list(fresh_cache.glob("*.so"))) == len(expected)
