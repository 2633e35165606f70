"""E2B's control plane over the fake provider, in process: listing, kill, timeouts and lifecycle, and error shapes.

The answers are checked against what the unmodified SDK reads from them (its generated models and its error mapping);
tests/e2e/test_e2b_sdk.py drives the SDK itself against a real server.
"""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b.api import handle_api_exception
from e2b.api.client.models import ListedSandbox, SandboxDetail
from e2b.api.client.models.error import Error
from e2b.exceptions import SandboxException
from e2b.sandbox.signature import get_signature
from fastapi import FastAPI

from corral.api.app import create_app
from corral.api.e2b import E2BState
from corral.api.e2b._state import SandboxExtras
from corral.providers.fake import FakeProvider
from corral.settings import Settings

pytestmark = pytest.mark.unit

TOKEN = "unit-test-token"
_PREFIX = struct.Struct(">BI")


class GatedFake(FakeProvider):
    """A fake whose pause keeps memory, and whose destroy waits while ``release`` is clear, so a test can look at a
    sandbox while it is being killed."""

    def __init__(self) -> None:
        super().__init__("gvisor", retention="memory")
        self.release = asyncio.Event()
        self.release.set()
        self.destroying = asyncio.Event()

    async def destroy(self, workspace_id: str) -> None:
        self.destroying.set()
        await self.release.wait()
        await super().destroy(workspace_id)


@pytest.fixture
async def fake() -> GatedFake:
    """The provider behind the app."""
    return GatedFake()


@pytest.fixture
async def app(tmp_path: Path, fake: GatedFake) -> AsyncIterator[FastAPI]:
    """The app over the gated fake (as ``gvisor``), with its lifespan running."""
    settings = Settings(data_dir=tmp_path, api_token=TOKEN, providers="gvisor", warm_pool_size=0, e2b_warm_pool_size=0)
    application = create_app(settings, providers={"gvisor": fake})
    async with application.router.lifespan_context(application):
        yield application
        fake.release.set()


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """A client carrying the API key, as the SDK sends it; app exceptions become 500 answers, as over HTTP."""
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://corral", headers={"X-API-KEY": TOKEN}) as http:
        yield http


def _state(app: FastAPI) -> E2BState:
    state: E2BState = app.state.e2b
    return state


async def _create(client: httpx.AsyncClient, **body: object) -> dict[str, Any]:
    answer = await client.post("/e2b/v2/sandboxes", json={"templateID": "base", **body})
    assert answer.status_code == 201, answer.text
    created: dict[str, Any] = answer.json()
    return created


def _envd(sandbox: dict[str, Any]) -> dict[str, str]:
    return {"E2b-Sandbox-Id": sandbox["sandboxID"], "X-Access-Token": sandbox["envdAccessToken"]}


async def _health(client: httpx.AsyncClient, sandbox: dict[str, Any]) -> httpx.Response:
    return await client.get("/e2b/envd/health", headers=_envd(sandbox))


async def _until(condition: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await condition():
            return
        await asyncio.sleep(0.01)
    pytest.fail(f"timed out waiting until {what}")


async def _ids(client: httpx.AsyncClient, **params: object) -> list[str]:
    answer = await client.get("/e2b/v2/sandboxes", params=params)
    assert answer.status_code == 200, answer.text
    return [s["sandboxID"] for s in answer.json()]


def _sdk_metadata(metadata: dict[str, str]) -> str:
    """The ``metadata`` query value as the SDK builds it (paginator.py): each key and value quoted, then urlencoded."""
    return urllib.parse.urlencode({urllib.parse.quote(k): urllib.parse.quote(v) for k, v in metadata.items()})


def _assert_e2b_error(answer: httpx.Response, status: int, message: str | None = None) -> None:
    """The answer is E2B's error shape with that status, readable by the SDK's generated ``Error`` model."""
    assert answer.status_code == status, answer.text
    body = answer.json()
    assert set(body) == {"code", "message"}, body
    assert body["code"] == status
    assert Error.from_dict(body).message == body["message"]
    if message is not None:
        assert body["message"] == message


async def test_list_is_newest_first_with_every_filter(client: httpx.AsyncClient) -> None:
    """v2 list: newest first (oldest with order=asc), each filter (metadata with characters that need encoding,
    state, template, startedAfter inclusive) narrows it, answers parse as the SDK's ListedSandbox, and v1 lists the
    running ones newest first."""
    odd = {"team": "x y&z=1/é"}
    first = await _create(client, metadata=odd)
    second = await _create(client, metadata={"team": "other"})
    third = await _create(client, metadata=odd, templateID="custom-image")
    ids = [s["sandboxID"] for s in (first, second, third)]
    listed = await client.get("/e2b/v2/sandboxes")
    assert [ListedSandbox.from_dict(s).sandbox_id for s in listed.json()] == ids[::-1]
    assert listed.headers["x-total-running"] == "3"
    assert await _ids(client, order="asc") == ids
    assert await _ids(client, order="desc") == ids[::-1]
    assert await _ids(client, metadata=_sdk_metadata(odd)) == [ids[2], ids[0]]
    assert await _ids(client, metadata=_sdk_metadata({"team": "nobody"})) == []
    assert await _ids(client, template="custom-image") == [ids[2]]
    started = [ListedSandbox.from_dict(s).started_at for s in listed.json()][::-1]
    assert await _ids(client, startedAfter=started[1].isoformat()) == [ids[2], ids[1]]
    assert await _ids(client, startedAfter=started[1].astimezone().isoformat()) == [ids[2], ids[1]]
    assert (await client.post(f"/e2b/sandboxes/{ids[1]}/pause")).status_code == 204
    assert await _ids(client, state="paused") == [ids[1]]
    assert await _ids(client, state="running") == [ids[2], ids[0]]
    assert await _ids(client, state="running,paused") == ids[::-1]
    running_v1 = (await client.get("/e2b/sandboxes")).json()
    assert [s["sandboxID"] for s in running_v1] == [ids[2], ids[0]]


async def test_list_pages_with_a_cursor(client: httpx.AsyncClient) -> None:
    """Pages follow E2B's cursor (base64url of start time and id in X-Next-Token, absent on the last page): a
    sandbox created between two pages does not shift the next one, and limit is at most 100."""
    ids = [(await _create(client))["sandboxID"] for _ in range(3)]
    first = await client.get("/e2b/v2/sandboxes", params={"limit": 2})
    assert [s["sandboxID"] for s in first.json()] == [ids[2], ids[1]]
    token = first.headers["x-next-token"]
    stamp, _, last_id = base64.urlsafe_b64decode(token).decode().partition("__")
    assert last_id == ids[1]
    assert datetime.fromisoformat(stamp.replace("Z", "+00:00")).tzinfo is not None
    newer = (await _create(client))["sandboxID"]
    second = await client.get("/e2b/v2/sandboxes", params={"limit": 2, "nextToken": token})
    assert [s["sandboxID"] for s in second.json()] == [ids[0]]
    assert "x-next-token" not in second.headers
    assert await _ids(client, limit=1000) == [newer, *ids[::-1]]
    ascending = await client.get("/e2b/v2/sandboxes", params={"limit": 2, "order": "asc"})
    rest = await client.get(
        "/e2b/v2/sandboxes", params={"limit": 2, "order": "asc", "nextToken": ascending.headers["x-next-token"]}
    )
    assert [s["sandboxID"] for s in ascending.json() + rest.json()] == [*ids, newer]


async def test_list_refuses_bad_parameters_in_e2b_shape(client: httpx.AsyncClient) -> None:
    """Bad list parameters answer 400 in E2B's shape, with E2B's words where E2B's handler words them."""
    for params, message in [
        ({"limit": 0}, None),
        ({"limit": "many"}, None),
        ({"state": "sleeping"}, None),
        ({"order": "sideways"}, None),
        ({"startedAfter": "yesterday"}, None),
        ({"nextToken": "not-a-cursor"}, "Invalid next token"),
        ({"metadata": "no-equals-sign"}, "Error parsing metadata"),
        ({"metadata": "bad%zzescape=1"}, "Error parsing metadata"),
    ]:
        _assert_e2b_error(await client.get("/e2b/v2/sandboxes", params=params), 400, message)


async def test_kill_refuses_the_sandbox_before_its_commands_end(
    app: FastAPI, client: httpx.AsyncClient, fake: GatedFake
) -> None:
    """Kill refuses the sandbox at once: while its workspace is still being destroyed, a command's stream has ended
    with "unavailable", envd's health answers 502 "was not found" (what the SDK's probe reads as gone), get answers
    404 and the list leaves it out; kill then answers 204, and a second kill 404."""
    sandbox = await _create(client)
    sid = sandbox["sandboxID"]
    assert (await _health(client, sandbox)).status_code == 204
    fake.release.clear()
    message = json.dumps({"process": {"cmd": "/bin/sh", "args": ["-c", "sleep 30"]}}).encode()
    command = asyncio.create_task(
        client.post(
            "/e2b/envd/process.Process/Start",
            headers={**_envd(sandbox), "Content-Type": "application/connect+json"},
            content=_PREFIX.pack(0, len(message)) + message,
        )
    )

    async def started() -> bool:
        return bool(_state(app).processes.running(sid))

    await _until(started, "the command runs")
    kill = asyncio.create_task(client.delete(f"/e2b/sandboxes/{sid}"))
    stream = await command
    await fake.destroying.wait()
    assert not kill.done()
    *_, (flags, end) = _frames(stream.content)
    assert (flags, end["error"]["code"]) == (2, "unavailable")
    health = await _health(client, sandbox)
    assert health.status_code == 502
    assert "was not found" in health.json()["message"]
    _assert_e2b_error(await client.get(f"/e2b/sandboxes/{sid}"), 404)
    assert sid not in await _ids(client)
    fake.release.set()
    assert (await kill).status_code == 204
    _assert_e2b_error(await client.delete(f"/e2b/sandboxes/{sid}"), 404)
    assert (await _health(client, sandbox)).status_code == 502


def _frames(body: bytes) -> list[tuple[int, dict[str, Any]]]:
    frames = []
    while body:
        flags, length = _PREFIX.unpack_from(body)
        frames.append((flags, json.loads(body[_PREFIX.size : _PREFIX.size + length])))
        body = body[_PREFIX.size + length :]
    return frames


async def test_deadline_refuses_the_sandbox_on_time(app: FastAPI, client: httpx.AsyncClient, fake: GatedFake) -> None:
    """From its deadline on, a sandbox is refused (health 502, get 404, off the list) even while its kill is still
    destroying the workspace; the kill then completes without any request."""
    sandbox = await _create(client)
    sid = sandbox["sandboxID"]
    fake.release.clear()
    state = _state(app)
    record = await state.service.get(sid)
    end_at = time.time() + 0.3
    await state.save(record, replace(SandboxExtras.of(record), end_at=end_at))
    health = await _health(client, sandbox)
    assert health.status_code == 204, "refused before its deadline"

    async def refused() -> bool:
        return (await _health(client, sandbox)).status_code == 502

    await _until(refused, "health refuses the sandbox")
    assert time.time() >= end_at
    await fake.destroying.wait()
    _assert_e2b_error(await client.get(f"/e2b/sandboxes/{sid}"), 404)
    assert sid not in await _ids(client)
    assert (await state.service.get(sid)).status == "ready", "the kill is still destroying it"
    fake.release.set()

    async def destroyed() -> bool:
        return (await state.service.get(sid)).status == "destroyed"

    await _until(destroyed, "the timer's kill destroyed the workspace")


async def test_set_timeout_moves_the_deadline_both_ways(app: FastAPI, client: httpx.AsyncClient) -> None:
    """set_timeout extends or shortens endAt (capped at 24 h after the start), 0 ends the sandbox at once, refresh
    only extends (by at least 15 s), and a paused sandbox answers 404 as E2B's does."""
    sandbox = await _create(client, timeout=60)
    sid = sandbox["sandboxID"]

    async def end_at() -> datetime:
        return SandboxDetail.from_dict((await client.get(f"/e2b/sandboxes/{sid}")).json()).end_at

    before = await end_at()
    assert (await client.post(f"/e2b/sandboxes/{sid}/timeout", json={"timeout": 3600})).status_code == 204
    longer = await end_at()
    assert 3500 < (longer - before).total_seconds() < 3600
    assert (await client.post(f"/e2b/sandboxes/{sid}/refreshes", json={"duration": 1})).status_code == 204
    assert await end_at() == longer, "a refresh never shortens"
    assert (await client.post(f"/e2b/sandboxes/{sid}/timeout", json={"timeout": 10})).status_code == 204
    shorter = await end_at()
    assert 0 < (shorter - datetime.now(UTC)).total_seconds() <= 10
    assert (await client.post(f"/e2b/sandboxes/{sid}/refreshes", json={})).status_code == 204
    assert (await end_at() - shorter).total_seconds() > 0, "a refresh extends to 15 s"
    assert (await client.post(f"/e2b/sandboxes/{sid}/timeout", json={"timeout": 10 * 24 * 3600})).status_code == 204
    capped = await end_at()
    started = SandboxDetail.from_dict((await client.get(f"/e2b/sandboxes/{sid}")).json()).started_at
    assert abs((capped - started).total_seconds() - 24 * 3600) < 1
    _assert_e2b_error(await client.post(f"/e2b/sandboxes/{sid}/timeout", json={}), 400)
    assert (await client.post(f"/e2b/sandboxes/{sid}/pause")).status_code == 204
    _assert_e2b_error(await client.post(f"/e2b/sandboxes/{sid}/timeout", json={"timeout": 30}), 404)
    connected = await client.post(f"/e2b/v2/sandboxes/{sid}/connect", json={})
    assert connected.status_code == 201
    assert 290 < ((await end_at()) - datetime.now(UTC)).total_seconds() <= 300, "connect's default timeout: 300 s"
    assert (await client.post(f"/e2b/sandboxes/{sid}/timeout", json={"timeout": 0})).status_code == 204
    assert (await _health(client, connected.json())).status_code == 502
    _assert_e2b_error(await client.get(f"/e2b/sandboxes/{sid}"), 404)
    _assert_e2b_error(await client.post("/e2b/v2/sandboxes", json={"templateID": "base", "timeout": 90000}), 400)


async def test_on_timeout_pause_then_auto_resume(app: FastAPI, client: httpx.AsyncClient) -> None:
    """With onTimeout pause and autoResume, the deadline pauses the sandbox (state paused, pauseMode full, endAt when
    it paused); a request to its envd then resumes it for its create timeout, as E2B's proxy does."""
    sandbox = await _create(client, timeout=120, autoPause=True, autoResume={"enabled": True})
    sid = sandbox["sandboxID"]
    detail = SandboxDetail.from_dict((await client.get(f"/e2b/sandboxes/{sid}")).json())
    assert detail.lifecycle.to_dict() == {"autoResume": True, "onTimeout": "pause"}
    state = _state(app)
    record = await state.service.get(sid)
    await state.save(record, replace(SandboxExtras.of(record), end_at=time.time() - 1))

    async def paused() -> bool:
        # The record says paused a moment before the pause's transition ends, and pauseMode shows only after that.
        answer = (await client.get(f"/e2b/sandboxes/{sid}")).json()
        return bool(answer["state"] == "paused" and "pauseMode" in answer)

    await _until(paused, "the timer paused the sandbox")
    body = (await client.get(f"/e2b/sandboxes/{sid}")).json()
    assert (body["state"], body["pauseMode"]) == ("paused", "full")
    assert (datetime.now(UTC) - SandboxDetail.from_dict(body).end_at).total_seconds() < 5
    assert (await _health(client, sandbox)).status_code == 204, "the request resumed it"
    resumed = SandboxDetail.from_dict((await client.get(f"/e2b/sandboxes/{sid}")).json())
    assert resumed.state.value == "running"
    assert 110 < (resumed.end_at - datetime.now(UTC)).total_seconds() <= 120


async def test_on_timeout_pause_without_auto_resume_stays_paused(
    app: FastAPI, client: httpx.AsyncClient, fake: GatedFake
) -> None:
    """Without autoResume a request to a sandbox paused at its timeout is refused (502), and connect resumes it; a
    sandbox past its deadline but not yet paused by its timer is paused before connect resumes it."""
    sandbox = await _create(client, autoPause=True)
    sid = sandbox["sandboxID"]
    state = _state(app)
    async with state.lifecycle_lock(sid):  # holds the timer back: the deadline passes, the pause has not run
        record = await state.service.get(sid)
        await state.save(record, replace(SandboxExtras.of(record), end_at=time.time() - 1))
        assert (await _health(client, sandbox)).status_code == 502
        listed = (await client.get("/e2b/v2/sandboxes", params={"state": "paused"})).json()
        assert [s["sandboxID"] for s in listed] == [sid], "a sandbox being paused lists as paused"
    connected = await client.post(f"/e2b/v2/sandboxes/{sid}/connect", json={"timeout": 60})
    assert connected.status_code == 201
    assert fake.calls.count(("pause", sid)) == 1, "paused once (before connect resumed it), not twice"
    assert (await _health(client, sandbox)).status_code == 204


async def test_lifecycle_options_are_checked(client: httpx.AsyncClient) -> None:
    """autoResume needs onTimeout pause with memory, as E2B's API requires."""
    for body in (
        {"autoResume": {"enabled": True}},
        {"autoPause": True, "autoPauseMemory": False, "autoResume": {"enabled": True}},
    ):
        _assert_e2b_error(await client.post("/e2b/v2/sandboxes", json={"templateID": "base", **body}), 400)


async def test_every_e2b_error_has_e2b_shape(app: FastAPI, client: httpx.AsyncClient) -> None:
    """Unknown paths and methods, FastAPI's validation errors, bodies over the cap and unexpected exceptions under
    /e2b answer E2B's shapes (Connect's for envd RPCs) that the SDK maps to its own exceptions; Corral's own API keeps
    its shape."""

    async def typed(n: int) -> dict[str, int]:
        return {"n": n}

    async def broken() -> None:
        raise RuntimeError("boom")

    app.add_api_route("/e2b/test-only/typed/{n}", typed)
    app.add_api_route("/e2b/test-only/broken", broken)
    anonymous = {"X-API-KEY": ""}
    unknown = await client.get("/e2b/no/such/route", headers=anonymous)
    _assert_e2b_error(unknown, 404, "validation error: no matching operation was found")
    error = handle_api_exception(unknown)
    assert isinstance(error, SandboxException)
    assert "no matching operation" in str(error)
    _assert_e2b_error(await client.put("/e2b/v2/sandboxes"), 404, "validation error: method not allowed")
    _assert_e2b_error(await client.get("/e2b/envd/nope"), 404, "404 page not found")
    _assert_e2b_error(await client.get("/e2b/test-only/typed/not-a-number"), 400)
    assert (await client.get("/e2b/test-only/typed/not-a-number")).json()["message"].startswith("validation error: ")
    _assert_e2b_error(await client.get("/e2b/test-only/broken"), 500)
    rpc = await client.post("/e2b/envd/nope.Nope/Call", json={})
    assert (rpc.status_code, rpc.json()["code"]) == (404, "unimplemented")
    big = b"x" * (1024 * 1024 + 1)
    _assert_e2b_error(await client.post("/e2b/v2/sandboxes", content=big), 413)

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(3):
            yield b"x" * (512 * 1024)

    _assert_e2b_error(await client.post("/e2b/v2/sandboxes", content=chunks()), 413)
    _assert_e2b_error(await client.post("/e2b/v2/sandboxes", content=b"{not json"), 400)
    _assert_e2b_error(
        await client.get("/e2b/sandboxes/nope"), 404, "Sandbox \"nope\" doesn't exist or you don't have access to it"
    )
    corral = await client.get("/no/such/route")
    assert corral.status_code == 404
    assert corral.json()["error"]["code"] == "not_found"


async def test_signed_url_errors_use_envd_words(client: httpx.AsyncClient) -> None:
    """Signed file URLs are refused with envd's own messages: missing, invalid, and expired signatures."""
    sandbox = await _create(client)
    anonymous = {"X-API-KEY": ""}
    missing = await client.get("/files", params={"path": "/workspace/x"}, headers=anonymous)
    _assert_e2b_error(missing, 401, "missing signature query parameter")
    forged = await client.get("/files", params={"path": "/workspace/x", "signature": "v1_forged"}, headers=anonymous)
    _assert_e2b_error(forged, 401, "invalid signature")
    expired = get_signature("/workspace/x", "read", None, sandbox["envdAccessToken"], -10)
    late = {"path": "/workspace/x", "signature": expired["signature"], "signature_expiration": expired["expiration"]}
    _assert_e2b_error(await client.get("/files", params=late, headers=anonymous), 401, "signature is already expired")
