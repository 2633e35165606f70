"""The stdin wrapper of :mod:`corral.orchestrator.stdin`, run by the host's own /bin/sh: the command reads the file,
then end of file; the file is gone once opened; arguments and the command line reach the program unchanged."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from corral.orchestrator.stdin import reading_from
from corral.providers.base import ExecMode, ExecRequest

pytestmark = pytest.mark.unit


def _run(request: ExecRequest, tmp_path: Path, data: bytes) -> tuple[str, bool]:
    """Run the wrapped request's argv with a fresh input file; its stdout and whether the file is left."""
    path = tmp_path / "input with 'quotes' $x"
    path.write_bytes(data)
    wrapped = reading_from(request, str(path))
    out = subprocess.run(wrapped.argv(), capture_output=True, check=True, timeout=30, cwd=tmp_path).stdout
    return out.decode(), path.exists()


def test_shell_mode_reads_the_file_and_removes_it(tmp_path: Path) -> None:
    """A shell line with quoted args reads the input, then EOF; the file is removed before the command runs."""
    request = ExecRequest("cat; printf '[%s]'", args=("a b",), mode=ExecMode.SHELL)
    assert _run(ExecRequest("ls; cat", mode=ExecMode.SHELL), tmp_path, b"x\n") == ("x\n", False)
    out, left = _run(request, tmp_path, b"in\n")
    assert (out, left) == ("in\n[a b]", False)


def test_argv_mode_keeps_arguments_literal(tmp_path: Path) -> None:
    """Argv mode runs the program with its arguments untouched (no shell expansion) and stdin from the file."""
    request = ExecRequest("sh", args=("-c", 'cat; printf "[%s]" "$@"', "sh", "$HOME", "*"), mode=ExecMode.ARGV)
    assert _run(request, tmp_path, b"typed") == ("typed[$HOME][*]", False)
