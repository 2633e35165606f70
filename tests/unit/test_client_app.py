"""The SDK and the ``corral`` command against the real app in-process, over the fake provider: pause and resume,
and how the server's answers about snapshots (none yet, unknown ids, fields ``from_snapshot`` fixes) reach the user
as typed errors and one-line CLI errors.

Taking, restoring and forking snapshots needs a provider that can; tests/e2e/test_sdk.py and test_cli.py do that on
gVisor.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

import corral.client
from corral.api.app import create_app
from corral.cli import app as cli_app
from corral.client import (
    AsyncCorral,
    InvalidRequestError,
    SnapshotNotFoundError,
    WorkspaceStateError,
)
from corral.providers.fake import FakeProvider
from corral.settings import Settings

pytestmark = pytest.mark.unit

TOKEN = "unit-test-token"
runner = CliRunner()


def _settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path, api_token=TOKEN, providers="gvisor", warm_pool_size=0, e2b_warm_pool_size=0)


@pytest.fixture
async def sdk(tmp_path: Path) -> AsyncIterator[AsyncCorral]:
    """An async SDK client talking to the app (started on this test's event loop) over a fake named gvisor."""
    app = create_app(_settings(tmp_path), providers={"gvisor": FakeProvider("gvisor")})
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with AsyncCorral("http://corral", TOKEN, transport=transport) as client:
            yield client


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Make the ``corral`` command's client talk to the app in-process (through Starlette's TestClient)."""
    app = create_app(_settings(tmp_path), providers={"gvisor": FakeProvider("gvisor")})
    with TestClient(app, base_url="http://corral") as http:

        def forward(request: httpx.Request) -> httpx.Response:
            answer = http.request(request.method, str(request.url), content=request.content,
                                  headers=dict(request.headers))  # fmt: skip
            headers = {k: v for k, v in answer.headers.items() if k not in ("content-encoding", "content-length")}
            return httpx.Response(answer.status_code, headers=headers, content=answer.content)

        real = corral.client.Corral

        def connected(base_url: str | None = None, token: str | None = None, **_: Any) -> corral.client.Corral:
            return real(base_url, token, transport=httpx.MockTransport(forward))

        monkeypatch.setattr(corral.client, "Corral", connected)
        monkeypatch.setenv("CORRAL_API_TOKEN", TOKEN)
        yield


async def test_pause_returns_what_was_kept_and_resume_brings_the_workspace_back(sdk: AsyncCorral) -> None:
    """``ws.pause()`` answers memory (status paused) or filesystem (status stopped) and refreshes the workspace;
    resume makes it ready with its files; a paused workspace pauses again while a stopped one is refused."""
    async with await sdk.workspaces.create(provider="gvisor") as ws:
        await ws.files.write("keep.txt", "kept")
        kept = await ws.pause()
        assert (kept, ws.status) in {("memory", "paused"), ("filesystem", "stopped")}
        assert (await sdk.workspaces.get(ws.id)).status == ws.status, "the SDK's view matches the server's"
        if kept == "memory":
            assert await ws.pause() == "memory"
        else:
            with pytest.raises(WorkspaceStateError, match="resume it before pausing"):
                await ws.pause()
        assert (await ws.resume()).status == "ready"
        assert await ws.files.read_text("keep.txt") == "kept"


async def test_snapshot_errors_come_back_typed(sdk: AsyncCorral) -> None:
    """With no snapshots the list is empty; an unknown id raises SnapshotNotFoundError (a LookupError) from get,
    delete and create(from_snapshot=...); fields the snapshot fixes and a fork count past 16 are InvalidRequestError
    naming them."""
    assert await sdk.snapshots.list() == []
    async with await sdk.workspaces.create(provider="gvisor") as ws:
        assert await sdk.snapshots.list(workspace_id=ws.id, name="x") == []
        with pytest.raises(InvalidRequestError, match="count"):
            await ws.fork(17)
    with pytest.raises(SnapshotNotFoundError, match="snapshot 'nope' does not exist") as missing:
        await sdk.snapshots.get("nope")
    assert isinstance(missing.value, LookupError)
    with pytest.raises(SnapshotNotFoundError):
        await sdk.snapshots.delete("nope")
    with pytest.raises(SnapshotNotFoundError):
        await sdk.workspaces.create(from_snapshot="nope")
    with pytest.raises(InvalidRequestError, match="network, provider: not allowed with from_snapshot"):
        await sdk.workspaces.create(from_snapshot="nope", provider="gvisor", network="default")


def test_cli_pause_resume_and_snapshot_errors(cli: None) -> None:
    """``workspaces pause`` prints the status and what was kept (--json adds ``pause`` to the workspace JSON);
    ``snapshots list`` says there are none; unknown snapshots and fields ``--from-snapshot`` fixes are one
    ``error:`` line each with exit code 1; ``rm`` reports every id and goes on."""
    created = runner.invoke(cli_app, ["workspaces", "create", "--provider", "gvisor"])
    assert created.exit_code == 0, created.output
    ws = created.stdout.strip()

    paused = runner.invoke(cli_app, ["workspaces", "pause", ws])
    assert paused.exit_code == 0, paused.output
    assert paused.stdout in {f"{ws} paused (memory kept)\n", f"{ws} stopped (filesystem kept)\n"}
    if "filesystem" in paused.stdout:
        assert "cannot keep memory" in paused.stderr
    assert runner.invoke(cli_app, ["workspaces", "resume", ws]).stdout == f"{ws} ready\n"
    as_json = json.loads(runner.invoke(cli_app, ["workspaces", "pause", ws, "--json"]).stdout)
    assert (as_json["id"], as_json["pause"] in ("memory", "filesystem")) == (ws, True)

    listed = runner.invoke(cli_app, ["snapshots", "list", "--workspace", ws])
    assert (listed.exit_code, listed.stdout) == (0, "no snapshots\n")
    assert json.loads(runner.invoke(cli_app, ["snapshots", "list", "--json"]).stdout) == []

    restored = runner.invoke(cli_app, ["workspaces", "create", "--from-snapshot", "nope"])
    assert (restored.exit_code, restored.stdout) == (1, "")
    assert restored.stderr == "error: snapshot_not_found: snapshot 'nope' does not exist\n"
    mixed = runner.invoke(cli_app, ["workspaces", "create", "--from-snapshot", "nope", "--memory", "2G"])
    assert mixed.exit_code == 1
    assert mixed.stderr.startswith("error: invalid_request: resource_limits: not allowed with from_snapshot")
    removed = runner.invoke(cli_app, ["snapshots", "rm", "nope", "gone"])
    assert removed.exit_code == 1
    assert removed.stderr.splitlines() == [
        "error: snapshot_not_found: snapshot 'nope' does not exist",
        "error: snapshot_not_found: snapshot 'gone' does not exist",
    ]
    assert runner.invoke(cli_app, ["workspaces", "rm", ws]).stdout == f"{ws}\n"
