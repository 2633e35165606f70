"""Fixtures of the unit tests that run the in-sandbox agent on the host."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

import corral.guest.agent as agent_module
from corral.guest.client import GuestConnection
from corral.providers.agent_runtime import spawner_source

DEADLINE_S = 10.0


@pytest.fixture(scope="module")
def spawner_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("spawner")
    (folder / "spawner.c").write_bytes(spawner_source())
    binary = folder / "spawner"
    subprocess.run(["gcc", "-static", "-Os", "-s", "-Wall", "-Werror", "-o", binary, folder / "spawner.c"], check=True)
    return binary


@pytest.fixture(params=["own-child", "spawner"])
def spawner_socket(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str | None]:
    """None (the agent starts commands itself) or the socket of a running spawner."""
    if request.param == "own-child":
        yield None
        return
    binary: Path = request.getfixturevalue("spawner_binary")
    path = str(tmp_path / "spawner.sock")
    proc = subprocess.Popen([binary, path])
    deadline = time.monotonic() + DEADLINE_S
    while not os.path.exists(path):
        assert proc.poll() is None, "the spawner exited at start"
        assert time.monotonic() < deadline, "the spawner never listened"
        time.sleep(0.01)
    try:
        yield path
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
async def conn(spawner_socket: str | None) -> AsyncIterator[GuestConnection]:
    env = {k: v for k, v in os.environ.items() if k not in ("TERM", "CORRAL_SPAWNER_SOCKET")}
    if spawner_socket is not None:
        env["CORRAL_SPAWNER_SOCKET"] = spawner_socket
    proc = await asyncio.create_subprocess_exec(
        sys.executable, agent_module.__file__, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    connection = GuestConnection(proc.stdout, proc.stdin, label="host agent")
    await connection.wait_ready(DEADLINE_S)
    try:
        yield connection
    finally:
        await connection.aclose()
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
