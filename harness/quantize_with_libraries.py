"""Quantizes a float checkpoint with the real quantization libraries: run by
harness/quantized_checkpoints.py with the quantizers' own venv, never imported by the project.

    <quantizers venv>/bin/python harness/quantize_with_libraries.py LIBRARY FLOAT OUT FORMAT...

Each FORMAT (a key of quantized_checkpoints.FORMATS, made by LIBRARY) is written to OUT/FORMAT:
the library's checkpoint (config.json, *.safetensors, tokenizer files) and
reference/dequantized.safetensors, the float32 weight of every int4 layer as the library itself
dequantizes it (its checkpoint names, `<module>.weight`), with reference/library.json (the
library, its version, the function used). The scales are cast to float32 before dequantizing:
the libraries compute (q - z) * s in the scale's dtype (fp16 / bf16), which rounds; in float32
every product of a 4-bit difference and such a scale is exact.

One library per process (each patches torch or transformers on import); a format is written to a
temporary sibling and renamed, so an interrupted run leaves nothing that looks finished.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import sys
import tempfile
import types
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

GROUP_SIZE = 128
# Short calibration texts: the tests check the loading, not the quantization's quality.
CALIBRATION_TEXTS = [
    "The quick brown fox jumps over the lazy dog, and the dog does not mind at all.",
    "Paris is the capital of France; Berlin is the capital of Germany.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n",
    "Once upon a time there was a small village by the sea, where fishermen mended nets.",
    "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen.",
    "To install the package, run pip install and then import it in your script.",
    "The meeting moved to Thursday at 10 am because the room was booked on Wednesday.",
    "A prime number has exactly two divisors: one and itself. 2, 3, 5, 7 and 11 are primes.",
]


def main(argv: list[str]) -> None:
    library, float_dir, out_dir, *formats = argv
    for name in formats:
        staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=out_dir))
        try:
            QUANTIZERS[library](name, Path(float_dir), staging)
            for path in Path(float_dir).glob("tokenizer*"):
                shutil.copy(path, staging / path.name)
            write_reference(name, library, staging)
            staging.rename(Path(out_dir) / name)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        print(f"{name}: written with {library}", flush=True)


def quantize_autoawq(name: str, float_dir: Path, out: Path) -> None:
    from awq import AutoAWQForCausalLM
    from transformers import AutoTokenizer

    model = AutoAWQForCausalLM.from_pretrained(str(float_dir))
    tokenizer = AutoTokenizer.from_pretrained(str(float_dir))
    config = {"zero_point": True, "q_group_size": GROUP_SIZE, "w_bit": 4, "version": "GEMM"}
    model.quantize(
        tokenizer,
        quant_config=config,
        calib_data=CALIBRATION_TEXTS,
        max_calib_samples=len(CALIBRATION_TEXTS),
        max_calib_seq_len=64,
        n_parallel_calib_samples=1,
    )
    model.save_quantized(str(out))


def quantize_gptqmodel(name: str, float_dir: Path, out: Path) -> None:
    # NOTE: gptqmodel 7.3 imports torchvision for InternVL at import time (7.7 made it lazy, but
    # needs torch 2.14); PyPI's torchvision does not load beside this machine's CPU torch, and
    # no text model needs it. transformers first, so it still sees no torchvision.
    import transformers  # noqa: F401

    stub = types.ModuleType("torchvision")
    stub.transforms = types.ModuleType("torchvision.transforms")  # type: ignore[attr-defined]
    functional = types.ModuleType("torchvision.transforms.functional")
    functional.InterpolationMode = None  # type: ignore[attr-defined]
    sys.modules.update(
        {
            "torchvision": stub,
            "torchvision.transforms": stub.transforms,  # type: ignore[attr-defined]
            "torchvision.transforms.functional": functional,
        }
    )
    from gptqmodel import BACKEND, GPTQModel, QuantizeConfig
    from gptqmodel.quantization.config import FORMAT

    # NOTE: offloading to disk between layers costs ~30 s here and saves nothing on a tiny model;
    # the default packing compiles a C++ extension first (~35 s on 2 cores), the original does not.
    common = {
        "bits": 4,
        "group_size": GROUP_SIZE,
        "device": "cpu",
        "offload_to_disk": False,
        "pack_impl": "original",
    }
    if name == "gptq":
        config = QuantizeConfig(desc_act=True, sym=False, **common)
    else:
        config = QuantizeConfig(desc_act=False, sym=True, format=FORMAT.GPTQ_V2, **common)
    model = GPTQModel.load(str(float_dir), config)
    model.quantize(CALIBRATION_TEXTS, batch_size=1, backend=BACKEND.AUTO)
    model.save(str(out))


def quantize_llmcompressor(name: str, float_dir: Path, out: Path) -> None:
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.awq import AWQModifier
    from llmcompressor.modifiers.quantization import GPTQModifier
    from llmcompressor.pipelines.cache import IntermediatesCache
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # NOTE: llmcompressor 0.14's AWQ pins its cached activations for faster transfers to a GPU,
    # which fails without one ("Cannot access accelerator device"); on CPU there is nothing to
    # transfer.
    if not torch.cuda.is_available():
        IntermediatesCache.pin_memory = lambda self, *args, **kwargs: None  # type: ignore[method-assign]
    tokenizer = AutoTokenizer.from_pretrained(str(float_dir))
    model = AutoModelForCausalLM.from_pretrained(str(float_dir), dtype=torch.bfloat16)
    samples = Dataset.from_dict({"text": CALIBRATION_TEXTS}).map(
        lambda sample: tokenizer(sample["text"]), remove_columns=["text"]
    )
    if name == "compressed-tensors-gptq":
        recipe = GPTQModifier(targets="Linear", scheme="W4A16", ignore=["lm_head"])
    else:
        recipe = AWQModifier(targets=["Linear"], scheme="W4A16_ASYM", ignore=["lm_head"])
    oneshot(
        model=model,
        dataset=samples,
        recipe=recipe,
        max_seq_length=64,
        num_calibration_samples=len(CALIBRATION_TEXTS),
    )
    model.save_pretrained(str(out), save_compressed=True)


QUANTIZERS = {
    "autoawq": quantize_autoawq,
    "gptqmodel": quantize_gptqmodel,
    "llmcompressor": quantize_llmcompressor,
}


def write_reference(name: str, library: str, checkpoint: Path) -> None:
    """reference/: the int4 layers' float32 weights by the library's own dequantization."""
    quantization = json.loads((checkpoint / "config.json").read_text())["quantization_config"]
    weights: dict[str, torch.Tensor] = {}
    for path in sorted(checkpoint.glob("*.safetensors")):
        if library == "autoawq":
            weights |= dequantize_awq(path)
            function = "awq.utils.packing_utils.dequantize_gemm"
        elif library == "gptqmodel":
            from gptqmodel.utils.model_dequant import convert_gptq_file

            # NOTE: the float tensors come back too; the reference keeps the int4 layers'.
            converted = convert_gptq_file(path, torch.float32, quantization, "cpu")
            with safe_open(str(path), framework="pt") as f:
                names = {key.rpartition(".")[0] for key in f.keys() if key.endswith(".qweight")}  # noqa: SIM118
            weights |= {f"{prefix}.weight": converted[f"{prefix}.weight"] for prefix in names}
            function = "gptqmodel.utils.model_dequant.convert_gptq_file"
        else:
            weights |= dequantize_compressed_tensors(path, quantization)
            function = "compressed_tensors PackedQuantizationCompressor.decompress"
    reference = checkpoint / "reference"
    reference.mkdir()
    save_file(
        {key: value.contiguous() for key, value in weights.items()},
        reference / "dequantized.safetensors",
    )
    distribution = {
        "autoawq": "autoawq",
        "gptqmodel": "gptqmodel",
        "llmcompressor": "compressed-tensors",
    }[library]
    facts = {
        "format": name,
        "quantizer": f"{library} {importlib.metadata.version(library)}",
        "dequantized_by": f"{function} ({distribution} {importlib.metadata.version(distribution)})",
        "torch": torch.__version__,
    }
    (reference / "library.json").write_text(json.dumps(facts, indent=2) + "\n")


def dequantize_awq(path: Path) -> dict[str, torch.Tensor]:
    from awq.utils.packing_utils import dequantize_gemm

    weights = {}
    with safe_open(str(path), framework="pt") as f:
        for key in f.keys():  # noqa: SIM118
            if key.endswith(".qweight"):
                prefix = key.rpartition(".")[0]
                weight = dequantize_gemm(
                    f.get_tensor(key),
                    f.get_tensor(f"{prefix}.qzeros"),
                    f.get_tensor(f"{prefix}.scales").float(),
                    4,
                    GROUP_SIZE,
                )
                weights[f"{prefix}.weight"] = weight.T.float()
    return weights


def dequantize_compressed_tensors(path: Path, quantization: dict) -> dict[str, torch.Tensor]:
    from compressed_tensors.compressors.pack_quantized import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationConfig

    (scheme,) = QuantizationConfig.model_validate(quantization).config_groups.values()
    weights = {}
    with safe_open(str(path), framework="pt") as f:
        keys = set(f.keys())
        for key in sorted(keys):
            if key.endswith(".weight_packed"):
                prefix = key.rpartition(".")[0]
                state = {
                    name: f.get_tensor(f"{prefix}.{name}")
                    for name in (
                        "weight_packed",
                        "weight_scale",
                        "weight_shape",
                        "weight_zero_point",
                    )
                    if f"{prefix}.{name}" in keys
                }
                state["weight_scale"] = state["weight_scale"].float()
                weight = PackedQuantizationCompressor.decompress(state, scheme)["weight"]
                weights[f"{prefix}.weight"] = weight.float()
    return weights


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main(sys.argv[1:])
