"""Genuine wheels written with zipfile, for a local package index that real pip downloads from.

A wheel is a zip with the package's files and a `<name>-<version>.dist-info/` holding METADATA,
WHEEL and RECORD (each file's sha256 and size); pip reads the name and version from the file name
and the metadata.
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path


def wheel_name(distribution: str, version: str) -> str:
    return f"{distribution.replace('-', '_')}-{version}-py3-none-any.whl"


def write_wheel(folder: Path, distribution: str, version: str, files: dict[str, bytes]) -> Path:
    """Write `<folder>/<wheel name>` with `files` (paths inside the wheel) and its dist-info."""
    dist_info = f"{distribution.replace('-', '_')}-{version}.dist-info"
    contents = dict(files)
    contents[f"{dist_info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n".encode()
    )
    contents[f"{dist_info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: cachet-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = [f"{path},sha256={_digest(data)},{len(data)}" for path, data in contents.items()]
    contents[f"{dist_info}/RECORD"] = (
        "\n".join([*record, f"{dist_info}/RECORD,,"]) + "\n"
    ).encode()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / wheel_name(distribution, version)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in contents.items():
            archive.writestr(name, data)
    return path


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
