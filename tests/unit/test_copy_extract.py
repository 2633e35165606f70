"""The download side of ``corral workspaces cp``: :func:`corral.cli._copy.extract` fed crafted tar streams, as a
hostile workspace would send them. Nothing may be written, linked to or touched outside the copy, and the client's
memory must not depend on what the workspace sends."""

from __future__ import annotations

import io
import os
import tarfile
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

import pytest

from corral.cli import _copy
from corral.cli._copy import extract
from corral.errors import InvalidRequestError

pytestmark = pytest.mark.unit


@dataclass(frozen=True)
class E:
    """One archive entry to craft."""

    name: str
    kind: bytes = tarfile.REGTYPE
    link: str = ""
    data: bytes = b""
    mtime: int = 1_600_000_000
    mode: int = 0o755


def _tar(*entries: E) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for e in entries:
            info = tarfile.TarInfo(e.name)
            info.type, info.linkname, info.mtime, info.mode = e.kind, e.link, e.mtime, e.mode
            info.size = len(e.data) if e.kind == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(e.data) if e.kind == tarfile.REGTYPE else None)
    buf.seek(0)
    return buf


def _run(stream: io.IOBase, target: Path, top: str = "top") -> tuple[int, list[str]]:
    warnings: list[str] = []
    count = extract(stream, target, top, warnings.append)  # type: ignore[arg-type]
    return count, warnings


def _escapes(root: Path) -> list[str]:
    """Every path under ``root`` whose real path lies outside it."""
    real_root = os.path.realpath(root)
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            real = os.path.realpath(os.path.join(dirpath, name))
            if real != real_root and not real.startswith(real_root + "/"):
                out.append(os.path.join(dirpath, name))
    return out


def _d(name: str, mtime: int = 1_600_000_000) -> E:
    return E(name, tarfile.DIRTYPE, mtime=mtime)


def _s(name: str, link: str) -> E:
    return E(name, tarfile.SYMTYPE, link=link)


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A directory holding a SECRET file and an OUT directory, with an empty DEST three levels down."""
    (tmp_path / "home" / "user" / "dl").mkdir(parents=True)
    (tmp_path / "SECRET").write_text("outside\n")
    (tmp_path / "OUT").mkdir()
    os.utime(tmp_path / "OUT", (1_000_000_000, 1_000_000_000))
    return tmp_path


@pytest.mark.parametrize("into_existing", [True, False], ids=["into-dest", "as-new-dest"])
def test_link_through_a_link_created_later_does_not_lead_out(victim: Path, into_existing: bool) -> None:
    """``esc -> d/../../../SECRET`` written while ``d`` is missing, then ``d -> ../../..``: no link leads out."""
    dest = victim / "home" / "user" / "dl"
    if not into_existing:
        dest = dest / "new"
    # ``d`` points at DEST (or at the new DEST, the copy root) itself; through it ``esc`` climbs to SECRET, while
    # its text read as if ``d`` were a directory stays inside.
    up, climb = ("../" * 5, "../" * 3) if into_existing else ("../" * 4, "../" * 4)
    dirs = map(_d, ("top", "top/a", "top/a/b", "top/a/b/c", "top/a/b/c/e"))
    stream = _tar(*dirs, _s("top/a/b/c/e/esc", f"d/{climb}SECRET"), _s("top/a/b/c/e/d", up.rstrip("/")))
    _, warnings = _run(stream, dest)
    assert _escapes(victim / "home") == []
    assert any("esc" in w for w in warnings), warnings


def test_a_later_entry_cannot_retarget_an_earlier_link(victim: Path) -> None:
    """``d -> z``, ``g -> d/../../../OUT``, then ``d -> ../../..``: the second ``d`` is refused, nothing leads out."""
    dest = victim / "home" / "user" / "dl"
    stream = _tar(
        *map(_d, ("top", "top/a", "top/a/b", "top/a/b/z")),
        _s("top/a/b/d", "z"),
        _s("top/a/b/g", "d/../../../OUT"),
        _s("top/a/b/d", "../../.."),
    )
    _, warnings = _run(stream, dest)
    assert _escapes(victim / "home") == []
    assert os.readlink(dest / "top/a/b/d") == "z"
    assert any("'top/a/b/d'" in w for w in warnings), warnings


def test_directory_entry_on_a_link_changes_nothing_outside(victim: Path) -> None:
    """The review's utime proof: a directory entry named like a link never has its times set through it."""
    dest = victim / "home" / "user" / "dl"
    stream = _tar(
        *map(_d, ("top", "top/a", "top/a/b", "top/a/b/z", "top/OUT")),
        _s("top/a/b/d", "z"),
        _s("top/a/b/g2", "d/../../../OUT"),
        E("top/a/b/g2", tarfile.DIRTYPE, mtime=0),
        _s("top/a/b/d", "../../.."),
    )
    _run(stream, dest)
    assert os.stat(victim / "OUT").st_mtime == 1_000_000_000
    assert _escapes(victim / "home") == []


def test_existing_symlink_in_dest_is_never_written_or_touched_through(victim: Path) -> None:
    """A symlink already in DEST named like the copy's directory: the entry is refused, OUT keeps its time and
    content, and a link aimed through the existing symlink is refused too."""
    dest = victim / "home" / "user" / "dl"
    (dest / "top").symlink_to(victim / "OUT")
    _, warnings = _run(_tar(_d("top", mtime=0), E("top/f", data=b"x")), dest)
    assert list((victim / "OUT").iterdir()) == [] and os.stat(victim / "OUT").st_mtime == 1_000_000_000
    assert len(warnings) == 2, warnings
    (dest / "top").unlink()
    (dest / "top").mkdir()
    (dest / "top" / "pre").symlink_to(victim)
    _, warnings = _run(_tar(_d("top"), _s("top/l", "pre/SECRET")), dest)
    assert not os.path.lexists(dest / "top" / "l") and any("'top/l'" in w for w in warnings), warnings


def test_top_directory_onto_a_new_target_warns_nothing(tmp_path: Path) -> None:
    """The review's t3: copying a directory to a new name prints no warning about the top directory itself."""
    count, warnings = _run(_tar(_d("top"), E("top/f", data=b"x")), tmp_path / "new")
    assert warnings == [] and count == 1 and (tmp_path / "new" / "f").read_bytes() == b"x"


def test_ordinary_tree_lands_with_modes_times_links_and_hard_links(tmp_path: Path) -> None:
    """Files, an executable, nested directories with their times, relative links (also a chain, and one to a
    directory) and a hard link all land as sent."""
    stream = _tar(
        _d("top", mtime=1_500_000_000),
        _d("top/sub", mtime=1_500_000_001),
        E("top/sub/run.sh", data=b"#!/bin/sh\n", mode=0o755),
        E("top/plain", data=b"p", mode=0o644),
        _s("top/l1", "sub/run.sh"),
        _s("top/l2", "l1"),
        _s("top/sub/dirlink", ".."),
        E("top/hard", tarfile.LNKTYPE, link="top/plain"),
    )
    count, warnings = _run(stream, tmp_path)
    root = tmp_path / "top"
    assert warnings == [] and count == 8
    assert os.stat(root / "sub" / "run.sh").st_mode & 0o777 == 0o755
    assert os.stat(root / "plain").st_mode & 0o777 == 0o644
    assert os.readlink(root / "l2") == "l1" and (root / "l2").read_bytes() == b"#!/bin/sh\n"
    assert (root / "sub" / "dirlink" / "plain").read_bytes() == b"p"
    assert os.stat(root / "hard").st_ino == os.stat(root / "plain").st_ino
    assert os.stat(root / "sub").st_mtime == 1_500_000_001 and os.stat(root).st_mtime == 1_500_000_000


def test_hard_links_only_to_files_of_this_copy(tmp_path: Path) -> None:
    """A hard link to a file outside the copy, to a directory or to a link of the copy is refused."""
    (tmp_path / "dest").mkdir()
    (tmp_path / "dest" / "mine").write_text("user's\n")
    stream = _tar(
        _d("top"),
        _d("top/d"),
        _s("top/s", "d"),
        E("top/h1", tarfile.LNKTYPE, link="mine"),
        E("top/h2", tarfile.LNKTYPE, link="top/d"),
        E("top/h3", tarfile.LNKTYPE, link="top/s"),
    )
    _, warnings = _run(stream, tmp_path / "dest")
    assert not any(os.path.lexists(tmp_path / "dest" / "top" / h) for h in ("h1", "h2", "h3"))
    assert len(warnings) == 3, warnings


def test_names_and_links_leading_out_are_refused(tmp_path: Path) -> None:
    """Absolute names, ``..`` in names, absolute links and links climbing out of the copy are skipped with one
    warning each; the copy's own links stay."""
    dest = tmp_path / "dest"
    dest.mkdir()
    stream = _tar(
        _d("top"),
        E("top/../evil", data=b"x"),
        E("/abs", data=b"x"),
        _s("top/abs", "/etc/passwd"),
        _s("top/up", "../.."),
        _s("top/sibling", "../other"),  # inside DEST but outside the copy
        _s("top/ok", "."),
    )
    _, warnings = _run(stream, dest)
    assert sorted(os.listdir(dest / "top")) == ["ok"]
    assert len(warnings) == 5 and all(w.startswith("skipped ") for w in warnings), warnings
    assert not (tmp_path / "evil").exists()


class _Header(io.RawIOBase):
    """A tar stream: one extended header of ``size`` bytes of ``x`` (then nothing), made as it is read."""

    def __init__(self, kind: bytes, size: int) -> None:
        info = tarfile.TarInfo("././@LongLink")
        info.type, info.size = kind, size
        self.head = info.tobuf(tarfile.GNU_FORMAT)
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray) -> int:  # type: ignore[override]
        if self.head:
            n = min(len(b), len(self.head))
            b[:n], self.head = self.head[:n], self.head[n:]
            return n
        n = min(len(b), self.left)
        b[:n] = b"x" * n
        self.left -= n
        return n


@pytest.mark.parametrize("kind", [tarfile.XHDTYPE, tarfile.GNUTYPE_LONGNAME], ids=["pax", "gnu-longname"])
def test_huge_extended_header_is_refused_without_reading_it(tmp_path: Path, kind: bytes) -> None:
    """The review's t4 (smaller): a 64 MiB PAX or GNU long-name header is refused with a clear error, and the
    client never holds more than a few MiB."""
    tracemalloc.start()
    try:
        with pytest.raises(InvalidRequestError, match="extended header"):
            _run(io.BufferedReader(_Header(kind, 64 * 2**20)), tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20, peak


def test_chained_extended_headers_count_together(tmp_path: Path) -> None:
    """Many PAX headers of 0.5 MiB each before one entry are refused once they pass 1 MiB together."""
    buf = io.BytesIO()
    for _ in range(8):
        info = tarfile.TarInfo("././@PaxHeader")
        body = b" comment=" + b"c" * (512 * 1024) + b"\n"
        record = b"%d" % (len(body) + 7) + body  # the length counts its own 7 digits
        info.type, info.size = tarfile.XHDTYPE, len(record)
        buf.write(info.tobuf(tarfile.USTAR_FORMAT) + record + b"\0" * (-len(record) % 512))
    buf.write(_tar(_d("top")).getvalue())
    buf.seek(0)
    with pytest.raises(InvalidRequestError, match="extended header"):
        _run(buf, tmp_path)


def test_bookkeeping_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the bound on what is remembered per copy, the download stops with a clear error."""
    monkeypatch.setattr(_copy, "_MAX_TRACKED", 64 * 1024)
    stream = _tar(_d("top"), *(E(f"top/f{i}", data=b"") for i in range(2000)))
    with pytest.raises(InvalidRequestError, match="entries"):
        _run(stream, tmp_path)
