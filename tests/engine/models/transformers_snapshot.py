"""transformers' own float32 load of a GGUF, saved once outside the repo.

The real-weight tests compare our engine with transformers on the GGUF checkpoints of the
catalogue. transformers dequantizes a GGUF (and converts its tokenizer) in Python: minutes on
the 2-core box (the 0.5B: 4.5 min), far beyond a test's budget. The first run saves what that
load gives (float32 safetensors and the tokenizer) under $XDG_CACHE_HOME/cachet/test-models
(default ~/.cache); later runs reload the saved copy in seconds, the same weights bit for bit.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from inference.directory_lock import directory_lock

SOURCE_MARKER = "cachet-gguf-source.json"


def snapshot_root() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "cachet" / "test-models"


def transformers_float32_dir(gguf_path: Path) -> Path:
    """A directory with transformers' float32 weights and tokenizer of `gguf_path` (made once)."""
    import transformers

    source = {
        "gguf": gguf_path.name,
        "size": gguf_path.stat().st_size,
        "transformers": transformers.__version__,
    }
    target = snapshot_root() / f"{gguf_path.stem}-{source['size']}"
    marker = target / SOURCE_MARKER
    if marker.is_file() and json.loads(marker.read_text()) == source:
        return target
    with directory_lock(target.parent):  # parallel test workers take turns
        if marker.is_file() and json.loads(marker.read_text()) == source:
            return target
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            _save_transformers_load(gguf_path, staging)
            (staging / SOURCE_MARKER).write_text(json.dumps(source))
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _save_transformers_load(gguf_path: Path, directory: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # NOTE: transformers marks GGUF-loaded models as quantized and refuses to save them; the
    # weights are already dequantized, so dropping the marker is what makes them saveable.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(directory)
