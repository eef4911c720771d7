"""retrieval.archive: a zip's files each get a verdict; unsafe, hidden, linked, oversized and
unsupported members are skipped with a reason, and a bomb or a huge listing is refused."""

from __future__ import annotations

import io
import os
import stat
import zipfile

import pytest

from retrieval.archive import MAX_MEMBERS, ArchiveError, Member, Skipped, unpack


def zip_of(members: dict[str, bytes], *, links: tuple[str, ...] = ()) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            info = zipfile.ZipInfo(name)
            if name in links:
                info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, data, zipfile.ZIP_DEFLATED)
    return buffer.getvalue()


def verdicts(data: bytes) -> dict[str, str]:
    return {v.name: ("ok" if isinstance(v, Member) else v.reason) for v in unpack(data)}


def test_supported_files_are_kept_and_the_rest_skipped_each_with_its_reason() -> None:
    data = zip_of(
        {
            "guide/intro.md": b"# Intro",
            "guide/notes.txt": b"notes",
            "../../etc/passwd.txt": b"escape",
            "/abs/path.md": b"absolute",
            "C:/windows.md": b"drive",
            "tool.exe": b"MZ",
            "inner.zip": zip_of({"a.md": b"a"}),
            ".hidden.md": b"hidden",
            "__MACOSX/guide/._intro.md": b"resource fork",
            "link.md": b"/etc/passwd",
        },
        links=("link.md",),
    )
    found = verdicts(data)
    assert found["guide/intro.md"] == "ok" and found["guide/notes.txt"] == "ok"
    for name in ("../../etc/passwd.txt", "/abs/path.md", "C:/windows.md"):
        assert "unsafe path" in found[name]
    assert "unsupported type" in found["tool.exe"] and "unsupported type" in found["inner.zip"]
    assert "hidden" in found[".hidden.md"] and "hidden" in found["__MACOSX/guide/._intro.md"]
    assert "link" in found["link.md"]
    members = [v for v in unpack(data) if isinstance(v, Member)]
    assert [m.data for m in members] == [b"# Intro", b"notes"]


def test_members_over_the_file_limit_or_the_unpacked_budget_are_skipped(settings) -> None:
    settings.CACHET_MAX_UPLOAD_MB = 1
    settings.CACHET_MAX_UNPACKED_MB = 2
    mb = 1024 * 1024
    data = zip_of(
        {
            "big.txt": b"a" * (mb + 1),
            "one.txt": b"b" * (mb - 10),
            "two.txt": b"c" * (mb - 10),
            "three.txt": b"d" * (mb - 10),
        }
    )
    found = verdicts(data)
    assert "1 MB limit" in found["big.txt"]
    assert found["one.txt"] == "ok" and found["two.txt"] == "ok"
    assert "unpacks to more than 2 MB" in found["three.txt"]


def test_a_zip_with_too_many_entries_is_refused_before_it_is_parsed() -> None:
    data = zip_of({f"f{n}.txt": b"" for n in range(MAX_MEMBERS + 1)})
    with pytest.raises(ArchiveError, match="more than 1000 files"):
        list(unpack(data))


def test_a_corrupt_zip_is_refused_with_a_reason() -> None:
    with pytest.raises(ArchiveError, match="corrupt or not a zip"):
        list(unpack(b"PK\x03\x04 not really a zip"))


def test_a_member_whose_data_is_damaged_is_skipped_and_the_others_kept() -> None:
    data = bytearray(zip_of({"good.md": b"good " * 50, "bad.md": os.urandom(2000).hex().encode()}))
    # Corrupt the deflated bytes of the second member (its CRC check fails).
    start = data.index(b"bad.md") + len("bad.md")
    data[start + 50 : start + 70] = b"\x00" * 20
    found = verdicts(bytes(data))
    assert found["good.md"] == "ok"
    assert "damaged" in found["bad.md"]
    assert all(isinstance(v, Member | Skipped) for v in unpack(bytes(data)))
