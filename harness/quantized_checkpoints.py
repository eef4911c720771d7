"""Small int4 checkpoints made by the real quantization libraries, for the engine's tests of AWQ,
GPTQ and compressed-tensors loading (tests/engine/test_quantized_checkpoint.py).

    python -m harness.quantized_checkpoints     # make test-models runs it

makes, once, under the test-models folder (CACHET_TEST_MODELS, else ~/.cache/cachet/test-models):
- quantized/float: a random 2-layer Qwen2-shaped model (hidden 256, MLP 768, q/k/v biases, tied
  embedding) in bf16 with SmolLM2's tokenizer, prepared from the bundled model package;
- quantized/<format> for each format of harness/quantize_with_libraries.py: that float model
  quantized to W4A16 in groups of 128 by AutoAWQ, GPTQModel or llmcompressor, with the
  library's own float32 dequantization of each int4 layer beside it (reference/).

The libraries run in their own venv (test-models/quantizers-venv, pinned below,
torch from this machine's CPU build): their pins (transformers, numpy) must not move the
project's. Work already done is skipped: a second run takes 0.2 s. Measured from nothing on the
2-core machine while others used it (nice 19, load ~3): 180 s, of which the venv's install 91 s,
the float model 12 s, and the three libraries 22 + 24 + 28 s (~10 s each once their modules are
byte-compiled).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

logger = logging.getLogger(__name__)

# NOTE: torch first, pinned to the CPU build on this machine's disk (anything else makes pip
# fetch a CUDA build of several GB). gptqmodel 7.3 is the last that takes torch 2.13. autoawq
# without its dependencies: it asks for triton, which only its GPU kernels use.
QUANTIZER_TORCH = "torch==2.13.0"
QUANTIZER_PACKAGES = ("llmcompressor==0.14.0.1", "gptqmodel==7.3.6")
QUANTIZER_PACKAGES_NO_DEPS = ("autoawq==0.2.9",)
WORKER = Path(__file__).with_name("quantize_with_libraries.py")
# format -> (the library that writes it, what it is); the worker knows the same names
FORMATS = {
    "awq": ("autoawq", "AutoAWQ GEMM with zero points"),
    "gptq": ("gptqmodel", "GPTQ checkpoint_format gptq (stored zeros - 1), asymmetric, desc_act"),
    "gptq-v2": ("gptqmodel", "GPTQ checkpoint_format gptq_v2, symmetric, no desc_act"),
    "compressed-tensors-gptq": ("llmcompressor", "pack-quantized W4A16 (symmetric) by GPTQ"),
    "compressed-tensors-awq": ("llmcompressor", "pack-quantized W4A16_ASYM by AWQ"),
}
SMOLLM2 = "smollm2-135m-instruct"
FLOAT_MODEL = {
    "model_type": "qwen2",
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
    # NOTE: larger than the default, so the random model's greedy choices are not near-ties.
    "initializer_range": 0.05,
}


def test_models_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """CACHET_TEST_MODELS, else `$XDG_CACHE_HOME/cachet/test-models` (~/.cache/...)."""
    configured = environ.get("CACHET_TEST_MODELS", "").strip()
    if configured:
        return Path(configured).expanduser()
    xdg_cache = environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(xdg_cache).expanduser() if xdg_cache else Path.home() / ".cache") / (
        "cachet/test-models"
    )


def quantized_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """Where the checkpoints are: quantized/<format> (and quantized/float)."""
    return test_models_dir(environ) / "quantized"


def make_checkpoints(directory: Path, formats: list[str]) -> list[str]:
    """Make the checkpoints of `formats` missing from `directory`; returns those made."""
    missing = [name for name in formats if not (directory / name / "reference").is_dir()]
    if not missing:
        return []
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    float_dir = directory / "float"
    if not (float_dir / "model.safetensors").is_file():
        save_float_model(float_dir)
    python = ensure_quantizers_venv(directory.parent / "quantizers-venv")
    by_library: dict[str, list[str]] = {}
    for name in missing:
        by_library.setdefault(FORMATS[name][0], []).append(name)
    # NOTE: gptqmodel sizes its CPU thread pools from the core count and refuses 2 cores;
    # HF_HUB_OFFLINE: everything comes from the float model's folder.
    env = os.environ | {"GPTQMODEL_CPU_WORKERS": "2", "HF_HUB_OFFLINE": "1"}
    for library, names in by_library.items():
        started = time.perf_counter()
        command = [str(python), str(WORKER), library, str(float_dir), str(directory), *names]
        # NOTE: run in the checkpoints' folder: gptqmodel writes a logs/ folder into its cwd.
        result = subprocess.run(
            command, cwd=directory, env=env, capture_output=True, text=True, check=False
        )
        if result.returncode:
            sys.stderr.write(result.stdout[-4000:] + result.stderr[-8000:])
            raise RuntimeError(f"{library} failed to quantize {', '.join(names)}")
        logger.info("%s: %s in %.0f s", library, ", ".join(names), time.perf_counter() - started)
    return missing


def save_float_model(target: Path) -> None:
    """The float model every format quantizes, with SmolLM2's tokenizer (a real vocabulary)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from inference import catalogue
    from inference.model_files import resolve_chat_model

    prepared = resolve_chat_model(
        SMOLLM2, target.parent / "prepared", model_cache=catalogue.cache_dir()
    ).directory
    tokenizer = AutoTokenizer.from_pretrained(str(prepared))
    options = dict(FLOAT_MODEL)
    config = AutoConfig.for_model(
        options.pop("model_type"),
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **options,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    with torch.no_grad():
        # NOTE: non-trivial biases and norm weights, so a mis-mapped one shows up.
        for name, param in model.named_parameters():
            if param.ndim == 1:
                param.normal_(1.0 if "norm" in name else 0.0, 0.1)
    staging = Path(tempfile.mkdtemp(prefix=".float-", dir=target.parent))
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    staging.rename(target)


def ensure_quantizers_venv(venv: Path) -> Path:
    """The quantizers' venv (made or remade when its pins changed); returns its python."""
    python = venv / "bin" / "python"
    marker = venv / ".cachet-packages.json"
    wanted = [QUANTIZER_TORCH, *QUANTIZER_PACKAGES, *QUANTIZER_PACKAGES_NO_DEPS]
    if marker.is_file() and json.loads(marker.read_text()) == wanted:
        return python
    started = time.perf_counter()
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # NOTE: --no-compile: byte-compiling every module of torch and transformers at install
    # costs more than compiling, on first import, the few the quantizers use.
    pip = [str(python), "-m", "pip", "install", "--quiet", "--no-compile"]
    subprocess.run([*pip, QUANTIZER_TORCH, *QUANTIZER_PACKAGES], check=True)
    subprocess.run([*pip, "--no-deps", *QUANTIZER_PACKAGES_NO_DEPS], check=True)
    marker.write_text(json.dumps(wanted))
    logger.info("quantizers venv %s installed in %.0f s", venv, time.perf_counter() - started)
    return python


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("formats", nargs="*", metavar="FORMAT", help=f"of {', '.join(FORMATS)}")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.formats) - set(FORMATS))
    if unknown:
        parser.error(f"unknown formats {', '.join(unknown)}; known: {', '.join(FORMATS)}")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    directory = quantized_dir()
    started = time.perf_counter()
    made = make_checkpoints(directory, args.formats or list(FORMATS))
    elapsed = time.perf_counter() - started
    print(
        f"quantized checkpoints in {directory}: "
        + (f"made {', '.join(made)} in {elapsed:.0f} s" if made else "all there")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
