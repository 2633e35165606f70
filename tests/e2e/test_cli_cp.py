"""``corral workspaces cp`` as a user runs it, against a real server on gVisor: files and directories both ways, a
100 MB tree byte for byte, clear errors, and a hostile workspace that cannot make the client write outside DEST."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import Server
from tests.e2e.test_cli import corral, ok

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def workspace(server: Server) -> Iterator[str]:
    """One gVisor workspace for the module, destroyed at the end."""
    answer = server.client.post("/api/v1/agent/workspaces", json={"provider": "gvisor"})
    assert answer.status_code == 201, answer.text
    ws = str(answer.json()["id"])
    yield ws
    server.client.delete(f"/api/v1/agent/workspaces/{ws}")


def _sh(server: Server, ws: str, script: str) -> str:
    run = corral(server, "workspaces", "exec", ws, script)
    assert run.returncode == 0, run.stderr
    return run.stdout


def _tree(root: Path) -> dict[str, str]:
    """Relative path -> a digest of the content (files), the link target (symlinks) or "dir"."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = "-> " + os.readlink(path)
        elif path.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def test_directory_of_100_mb_round_trips_byte_identical(server: Server, workspace: str, tmp_path: Path) -> None:
    """A 100 MB tree (random files, nested directories, a relative symlink) goes in and comes back identical,
    landing as docker cp lands it: inside an existing directory, or as a new one."""
    src = tmp_path / "big"
    (src / "nested" / "deeper").mkdir(parents=True)
    for i, where in enumerate([src, src / "nested", src / "nested" / "deeper", src]):
        (where / f"blob{i}.bin").write_bytes(os.urandom(25 * 1024 * 1024))
    (src / "nested" / "small.txt").write_text("hello\n")
    (src / "link").symlink_to("nested/small.txt")
    ok(server, "workspaces", "cp", str(src), f"{workspace}:/workspace/up")  # missing: becomes /workspace/up
    sums = _sh(server, workspace, "cd /workspace/up && sha256sum blob0.bin nested/deeper/blob2.bin && readlink link")
    assert hashlib.sha256((src / "blob0.bin").read_bytes()).hexdigest() in sums
    assert sums.rstrip().endswith("nested/small.txt")

    existing = tmp_path / "existing"
    existing.mkdir()
    ok(server, "workspaces", "cp", f"{workspace}:up", str(existing))  # relative to /workspace; lands inside
    assert _tree(existing / "up") == _tree(src)
    fresh = tmp_path / "fresh"
    ok(server, "workspaces", "cp", f"{workspace}:/workspace/up", str(fresh))  # missing: becomes it
    assert _tree(fresh) == _tree(src)


def test_single_file_both_ways(server: Server, workspace: str, tmp_path: Path) -> None:
    """A file goes in under a new name and into an existing directory, and comes back out under a new name."""
    local = tmp_path / "notes.txt"
    local.write_bytes(b"line one\n\x00binary\xff\n")
    ok(server, "workspaces", "cp", str(local), f"{workspace}:renamed.txt")
    _sh(server, workspace, "mkdir -p /workspace/box")
    ok(server, "workspaces", "cp", str(local), f"{workspace}:/workspace/box")
    listing = _sh(server, workspace, "cmp /workspace/renamed.txt /workspace/box/notes.txt && echo same")
    assert listing == "same\n"
    back = tmp_path / "back.txt"
    ok(server, "workspaces", "cp", f"{workspace}:/workspace/box/notes.txt", str(back))
    assert back.read_bytes() == local.read_bytes()


def test_missing_source_is_a_clear_error(server: Server, workspace: str, tmp_path: Path) -> None:
    """A missing path on either side, or no workspace side at all, exits nonzero with one line naming it."""
    down = corral(server, "workspaces", "cp", f"{workspace}:/workspace/nope", str(tmp_path / "x"))
    assert down.returncode == 1 and "file_not_found" in down.stderr and "Traceback" not in down.stderr, down.stderr
    assert not (tmp_path / "x").exists()
    up = corral(server, "workspaces", "cp", str(tmp_path / "absent"), f"{workspace}:/workspace/x")
    assert up.returncode == 1 and "absent" in up.stderr and "Traceback" not in up.stderr, up.stderr
    both = corral(server, "workspaces", "cp", str(tmp_path), str(tmp_path / "y"))
    assert both.returncode == 2 and "exactly one" in both.stderr


def test_hostile_workspace_cannot_write_outside_dest(server: Server, workspace: str, tmp_path: Path) -> None:
    """Symlinks to an outside directory and to ../.., and an archive with ``..`` and absolute names crafted inside
    the workspace, write nothing outside DEST (the links leading out are skipped with a warning)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    _sh(
        server,
        workspace,
        f"""set -e
        mkdir -p /workspace/evil/sub
        ln -s {outside} /workspace/evil/abs
        ln -s ../.. /workspace/evil/up
        echo ok > /workspace/evil/sub/plain.txt""",
    )
    dest = tmp_path / "dest"
    run = corral(server, "workspaces", "cp", f"{workspace}:/workspace/evil", str(dest))
    assert run.returncode == 0, run.stderr
    assert "skipped" in run.stderr and "abs" in run.stderr and "up" in run.stderr
    assert (dest / "sub" / "plain.txt").read_text() == "ok\n"
    assert not os.path.lexists(dest / "abs") and not os.path.lexists(dest / "up")
    assert list(outside.iterdir()) == []

    # Now the workspace serves a crafted archive instead of its own tar: the server's tar is replaced by a script.
    _sh(
        server,
        workspace,
        f"""set -e
        cd /tmp && rm -rf craft && mkdir craft && cd craft
        mkdir -p hostile && echo in > hostile/in.txt
        ln -s {outside} hostile/door
        python3 - <<'EOF'
import io, tarfile
with tarfile.open('/tmp/crafted.tar', 'w') as tar:
    tar.add('hostile')
    for name in ('hostile/door/through.txt', '../escape.txt', '{outside}/abs.txt', 'other/sibling.txt'):
        data = b'pwned'
        info = tarfile.TarInfo(name); info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
EOF
        test -x /usr/bin/tar.real || mv /usr/bin/tar /usr/bin/tar.real
        printf '#!/bin/sh\\ncat /tmp/crafted.tar\\n' > /usr/bin/tar && chmod +x /usr/bin/tar""",
    )
    try:
        crafted = tmp_path / "crafted"
        crafted.mkdir()
        run = corral(server, "workspaces", "cp", f"{workspace}:/workspace/hostile", str(crafted))
        assert "Traceback" not in run.stderr, run.stderr
    finally:
        _sh(server, workspace, "mv /usr/bin/tar.real /usr/bin/tar")
    assert list(outside.iterdir()) == []
    assert not (tmp_path / "escape.txt").exists() and not (crafted / "other").exists()
    written = {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()}
    assert all(not w.endswith(("through.txt", "escape.txt", "abs.txt", "sibling.txt")) for w in written), written


def test_upload_streams_without_a_size_limit_and_leaves_no_temporary_file(
    server: Server, workspace: str, tmp_path: Path
) -> None:
    """A chunked upload past the JSON body cap is accepted (the route streams), and its temporary file is gone."""
    blob = tmp_path / "two-mib.bin"
    blob.write_bytes(os.urandom(2 * 1024 * 1024))
    ok(server, "workspaces", "cp", str(blob), f"{workspace}:/workspace/s/")
    assert _sh(server, workspace, "stat -c %s /workspace/s/two-mib.bin") == f"{2 * 1024 * 1024}\n"
    assert _sh(server, workspace, "ls -a /tmp | grep -c corral-upload || true") == "0\n"


def test_server_answers_404_before_streaming(server: Server, workspace: str) -> None:
    """GET .../files/archive of a missing path is a JSON 404, not a cut stream."""
    answer = server.client.get(f"/api/v1/agent/workspaces/{workspace}/files/archive", params={"path": "missing"})
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "file_not_found"
