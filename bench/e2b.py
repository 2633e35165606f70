"""E2B scenario (``--only e2b``): the unmodified E2B SDK against Corral's E2B API, and Corral's own API in the same run.

One server with both warm pools (the isolated default pool for native creates, and E2B's default-sandbox pool,
CORRAL_E2B_WARM_POOL_SIZE, for ``Sandbox.create()``). Rounds interleave the two ways, each after the pools refilled
and settled, so neither is measured while a refill runs. The E2B side is split into timed parts (create, first
command; and the control-plane POST alone through the lean client) so a missed target shows where the time goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
import time
from dataclasses import dataclass, field
from typing import Any

from e2b import AsyncSandbox

from bench.context import Bench
from bench.latency import POOL_SETTLE_S
from bench.report import Row, Target
from bench.server import CorralServer, ServerError
from bench.stats import Samples
from corral.client._lean import LeanClient

__all__ = ["e2b_latency"]

FIRST_COMMAND_TARGET_MS = 60.0
ROUND_TRIP_RATIO_TARGET = 2.0


@dataclass
class _E2BSamples:
    e2b_first: Samples = field(default_factory=Samples)
    e2b_create: Samples = field(default_factory=Samples)
    e2b_command: Samples = field(default_factory=Samples)
    e2b_post: Samples = field(default_factory=Samples)
    native_first: Samples = field(default_factory=Samples)
    native_create: Samples = field(default_factory=Samples)
    e2b_exec: Samples = field(default_factory=Samples)
    native_exec: Samples = field(default_factory=Samples)
    envd_lean: Samples = field(default_factory=Samples)
    native_bash: Samples = field(default_factory=Samples)
    e2b_pooled: int = 0
    native_pooled: int = 0
    post_pooled: int = 0


def _sdk_options(server: CorralServer) -> dict[str, Any]:
    """What a user sets in E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY, passed as the SDK's own options."""
    return {"api_key": server.token, "api_url": f"{server.url}/e2b", "sandbox_url": f"{server.url}/e2b/envd"}


async def _settled(server: CorralServer) -> None:
    await server.wait_pool_full()
    await asyncio.sleep(POOL_SETTLE_S)


async def _from_pool(server: CorralServer, workspace_id: str) -> bool:
    return bool((await server.call("GET", f"/api/v1/agent/workspaces/{workspace_id}"))["from_warm_pool"])


async def e2b_latency(bench: Bench) -> None:
    """Create to first command and command round trips, E2B SDK against Corral's own API, on one server."""
    pool = bench.config.warm_pool
    server = await bench.start_server(
        "e2b",
        {"CORRAL_PROVIDERS": "gvisor", "CORRAL_WARM_POOL_SIZE": str(pool), "CORRAL_E2B_WARM_POOL_SIZE": str(pool)},
    )
    options = _sdk_options(server)
    samples = _E2BSamples()
    try:
        for round_ in range(bench.config.creates + 1):  # round 0 is the warm-up
            await _settled(server)
            started = time.perf_counter()
            sandbox = await AsyncSandbox.create(**options)
            created = time.perf_counter()
            try:
                result = await sandbox.commands.run("true")
                finished = time.perf_counter()
                if result.exit_code != 0:
                    raise ServerError(f"e2b: `true` exited with {result.exit_code}")
            finally:
                await sandbox.kill()
            pooled = await _from_pool(server, sandbox.sandbox_id)

            await _settled(server)
            native_started = time.perf_counter()
            workspace = await server.create_workspace()
            native_created = time.perf_counter()
            try:
                await server.exec_true(workspace["id"])
                native_finished = time.perf_counter()
            finally:
                await server.delete_workspace(workspace["id"])

            # The control plane alone: E2B's create without the SDK (the server's share of Sandbox.create).
            await _settled(server)
            with samples.e2b_post.time() if round_ else contextlib.nullcontext():
                answer = await server.call("POST", "/e2b/v2/sandboxes", json={"templateID": "base"}, expect=201)
            post_pooled = await _from_pool(server, answer["sandboxID"])
            await server.call("DELETE", f"/e2b/sandboxes/{answer['sandboxID']}", expect=204)
            if round_:
                samples.e2b_create.add((created - started) * 1000)
                samples.e2b_command.add((finished - created) * 1000)
                samples.e2b_first.add((finished - started) * 1000)
                samples.native_create.add((native_created - native_started) * 1000)
                samples.native_first.add((native_finished - native_started) * 1000)
                samples.e2b_pooled += pooled
                samples.native_pooled += bool(workspace["from_warm_pool"])
                samples.post_pooled += post_pooled
        await _settled(server)
        await _round_trips(bench, server, options, samples)
    finally:
        await bench.stop_server(server)
    _rows(bench, samples)


def _envelope(message: dict[str, Any]) -> bytes:
    """One Connect streaming-request message: flags, big-endian length, JSON."""
    body = json.dumps(message).encode()
    return b"\x00" + struct.pack(">I", len(body)) + body


async def _round_trips(bench: Bench, server: CorralServer, options: dict[str, Any], samples: _E2BSamples) -> None:
    """``commands.run("true")`` on one sandbox against POST exec ``true`` on one workspace, interleaved, with the
    parts in between: the same envd Start RPC without the SDK (lean client), and a native exec of what the SDK runs
    (``/bin/bash -l -c true``)."""
    sandbox = await AsyncSandbox.create(**options)
    workspace = await server.create_workspace()
    answer = await server.call("GET", f"/e2b/sandboxes/{sandbox.sandbox_id}")
    envd = LeanClient(
        "127.0.0.1",
        server.port,
        {
            "E2b-Sandbox-Id": sandbox.sandbox_id,
            "X-Access-Token": answer["envdAccessToken"],
            "Content-Type": "application/connect+json",
            "Connect-Protocol-Version": "1",
        },
    )
    # What commands.run("true") sends (the SDK's defaults: a login shell, no stdin, the default user).
    start = _envelope({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "true"], "envs": {}}, "stdin": False})

    async def envd_true() -> None:
        resp = await envd.request("POST", "/e2b/envd/process.Process/Start", content=start)
        if resp.status != 200 or b"exit status 0" not in resp.body:  # the stream's end event
            raise ServerError(f"envd Start -> {resp.status}: {resp.body[-300:]!r}")

    async def native_bash() -> None:
        body = {"command": "/bin/bash", "args": ["-l", "-c", "true"], "mode": "argv"}
        result = await server.call("POST", f"/api/v1/agent/workspaces/{workspace['id']}/exec", json=body)
        if result["exit_code"] != 0:
            raise ServerError(f"native bash -l -c true exited with {result['exit_code']}")

    async def sdk_true() -> None:
        await sandbox.commands.run("true")

    async def native_true() -> None:
        await server.exec_true(workspace["id"])

    ways = [
        (samples.e2b_exec, sdk_true),
        (samples.envd_lean, envd_true),
        (samples.native_bash, native_bash),
        (samples.native_exec, native_true),
    ]
    try:
        for round_ in range(bench.config.execs + 1):  # round 0 is the warm-up
            for bucket, call in ways:
                if round_ == 0:
                    await call()
                    continue
                with bucket.time():
                    await call()
    finally:
        await envd.aclose()
        await sandbox.kill()
        await server.delete_workspace(workspace["id"])


def _rows(bench: Bench, samples: _E2BSamples) -> None:
    e2b_first, native_first = samples.e2b_first.measure(), samples.native_first.measure()
    e2b_exec, native_exec = samples.e2b_exec.measure(), samples.native_exec.measure()
    ratio = e2b_exec.p50 / native_exec.p50
    native_label = "Corral API: POST workspace + exec"
    bench.rows += [
        Row(
            "E2B SDK: Sandbox.create + commands.run(`true`), warm pool",
            e2b_first,
            native_first,
            native_label,
            Target(f"p50 <= {FIRST_COMMAND_TARGET_MS:g} ms", e2b_first.p50 <= FIRST_COMMAND_TARGET_MS),
        ),
        Row(
            "E2B SDK: part: Sandbox.create",
            samples.e2b_create.measure(),
            samples.native_create.measure(),
            "Corral API: POST workspace",
        ),
        Row(
            "E2B SDK: part: first commands.run(`true`)",
            samples.e2b_command.measure(),
            native_exec,
            "Corral API: exec (round trip below)",
        ),
        Row(
            "E2B API: POST /e2b/v2/sandboxes alone (lean client)",
            samples.e2b_post.measure(),
            samples.native_create.measure(),
            "Corral API: POST workspace",
        ),
        Row(
            "E2B SDK: commands.run(`true`) round trip through envd",
            e2b_exec,
            native_exec,
            "Corral API: exec `true` (lean client)",
            Target(
                f"<= {ROUND_TRIP_RATIO_TARGET:g}x native exec (p50)", ratio <= ROUND_TRIP_RATIO_TARGET, f"{ratio:.2f}x"
            ),
        ),
        Row(
            "E2B API: part: envd Start of `bash -l -c true` (lean client, no SDK)",
            samples.envd_lean.measure(),
            native_exec,
            "Corral API: exec `true` (lean client)",
        ),
        Row(
            "Corral API: part: exec `/bin/bash -l -c true` (what the SDK runs)",
            samples.native_bash.measure(),
            native_exec,
            "Corral API: exec `true` (lean client)",
        ),
    ]
    n = bench.config.creates
    bench.notes.append(
        f"E2B: one server (gVisor) with CORRAL_WARM_POOL_SIZE={bench.config.warm_pool} and "
        f"CORRAL_E2B_WARM_POOL_SIZE={bench.config.warm_pool}; both pools refilled and settled ({POOL_SETTLE_S:g} s) "
        f"before every create. {samples.e2b_pooled}/{n} SDK creates, {samples.post_pooled}/{n} bare POSTs and "
        f"{samples.native_pooled}/{n} native creates got a pooled workspace. E2B = the unmodified SDK's AsyncSandbox "
        "(httpx underneath, as users run it) with api_url/sandbox_url/api_key pointing at the server; native = "
        "POST /api/v1/agent/workspaces + POST exec `true` (argv) through the bench's lean keep-alive client. Parts: "
        "Sandbox.create alone, the first commands.run alone, and POST /e2b/v2/sandboxes through the lean client "
        f"(the server's share of a create). Round trips: {bench.config.execs} interleaved commands.run(`true`) "
        "(a shell command through envd's process stream) against POST exec `true`."
    )
