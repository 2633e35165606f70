"""Latency scenarios, one workspace at a time: session ready (warm and cold), create to first command, exec round
trips and 10 MB file round trips. Variants are interleaved round by round, so drift on the machine hits all of them
alike; every loop runs one untimed round first (the warm-up)."""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from bench.context import Bench
from bench.plain import PlainContainer, tar_one_file
from bench.report import Row, Target
from bench.server import CorralServer, ServerError
from bench.stats import Samples
from corral.providers.base import ExecMode, ExecRequest
from corral.providers.docker import DockerProvider

__all__ = [
    "TRUE",
    "WORKSPACE_CONFIG",
    "SessionOutcome",
    "Starts",
    "cold_starts",
    "exec_and_files",
    "one_session",
    "start_rows",
    "wait_sessions",
    "warm_starts",
]

TRUE = ExecRequest("true", mode=ExecMode.ARGV)
SESSION_POLL_S = 0.002
"""Single sessions are polled back to back (2 ms between GETs), so a ready time is late by at most one GET."""
SESSION_TIMEOUT_S = 120.0
POOL_SETTLE_S = 0.3
"""After the warm pool is full again, time for the newest member's agent to boot (about 0.3 s under gVisor)."""
WORKSPACE_CONFIG = {"enabled": True, "repo_source": {"type": "none"}}
"""An agent type with a workspace, no repository and no setup commands: session ready = workspace ready."""

T = TypeVar("T")


# --- sessions and creates -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SessionOutcome:
    """How a session's provisioning ended, and when (ms after its start) the client saw it."""

    ready_ms: float
    ok: bool
    detail: str
    workspace_id: str | None


async def wait_sessions(
    server: CorralServer, started: Mapping[str, float], *, poll_s: float, timeout_s: float
) -> dict[str, SessionOutcome]:
    """Poll each pending session in turn (one GET in flight at a time) until none is ``provisioning``.

    ``started`` maps session ids to the ``perf_counter()`` their clock started at. A session is ok when it is
    ``active``, not degraded, and has a workspace.
    """
    pending = dict(started)
    outcomes: dict[str, SessionOutcome] = {}
    deadline = time.perf_counter() + timeout_s
    while pending:
        for session_id, t0 in list(pending.items()):
            session = await server.get_session(session_id)
            if session["status"] == "provisioning":
                continue
            ok = session["status"] == "active" and not session["degraded"] and session["workspace_id"] is not None
            detail = session["degraded_reason"] or session["status"]
            outcomes[session_id] = SessionOutcome(
                (time.perf_counter() - t0) * 1000, ok, detail, session["workspace_id"]
            )
            del pending[session_id]
        if pending and time.perf_counter() > deadline:
            for session_id in pending:
                outcomes[session_id] = SessionOutcome(
                    math.nan, False, f"still provisioning after {timeout_s:g} s", None
                )
            break
        if pending:
            await asyncio.sleep(poll_s)
    return outcomes


async def one_session(server: CorralServer, agent_type_id: str) -> SessionOutcome:
    """POST a session, wait until it is active, end it (untimed). Raises when provisioning failed.

    A POST that answers ``active`` (a warm workspace, nothing to check out or set up) is ready when it returns: the
    client knows it then, without another GET."""
    started = time.perf_counter()
    session = await server.post_session(agent_type_id)
    session_id = str(session["id"])
    try:
        if session["status"] == "active":
            ok = not session["degraded"] and session["workspace_id"] is not None
            outcome = SessionOutcome((time.perf_counter() - started) * 1000, ok, "active", session["workspace_id"])
        else:
            outcome = (
                await wait_sessions(server, {session_id: started}, poll_s=SESSION_POLL_S, timeout_s=SESSION_TIMEOUT_S)
            )[session_id]
        if not outcome.ok:
            raise ServerError(f"{server.name}: session {session_id} did not become active: {outcome.detail}")
        return outcome
    finally:
        await server.end_session(session_id)


async def _from_pool(server: CorralServer, workspace_id: str | None) -> bool:
    """Whether the workspace came from the warm pool (its record says so, destroyed or not)."""
    if workspace_id is None:
        return False
    return bool((await server.call("GET", f"/api/v1/agent/workspaces/{workspace_id}"))["from_warm_pool"])


async def _pool_settled(server: CorralServer) -> None:
    """The pool is full and its newest member's agent has booted, so no refill competes with a measurement."""
    await server.wait_pool_full()
    await asyncio.sleep(POOL_SETTLE_S)


async def _lifecycle(
    create: Callable[[], Awaitable[T]],
    first_command: Callable[[T], Awaitable[None]],
    remove: Callable[[T], Awaitable[None]],
) -> tuple[float, float, T]:
    """Create, run one command, remove (untimed). Returns ms to running, ms to the command finished, the handle."""
    started = time.perf_counter()
    handle = await create()
    try:
        running = time.perf_counter()
        await first_command(handle)
        finished = time.perf_counter()
    finally:
        await remove(handle)
    return (running - started) * 1000, (finished - started) * 1000, handle


async def _nothing(_: object) -> None:
    """The first command of a lifecycle that only measures create to running."""


@dataclass
class Starts:
    """Samples of the start scenarios. :func:`warm_starts` and :func:`cold_starts` fill them in separate phases (so
    the warm server's refills never overlap a cold measurement); :func:`start_rows` turns them into rows."""

    session_warm: Samples = field(default_factory=Samples)
    session_cold: Samples = field(default_factory=Samples)
    first_warm: Samples = field(default_factory=Samples)
    first_cold: Samples = field(default_factory=Samples)
    first_plain: Samples = field(default_factory=Samples)
    running_cold: Samples = field(default_factory=Samples)
    running_provider: Samples = field(default_factory=Samples)
    running_plain: Samples = field(default_factory=Samples)
    running_plain_volume: Samples = field(default_factory=Samples)
    pooled_sessions: int = 0
    pooled_creates: int = 0


async def warm_starts(bench: Bench, warm: CorralServer, starts: Starts) -> None:
    """From the warm pool, alternating: POST session to ``active``, and POST workspace + exec ``true``."""
    agent_type = await warm.create_agent_type("bench-warm", WORKSPACE_CONFIG)
    for round_ in range(bench.config.creates + 1):  # round 0 is the warm-up
        await _pool_settled(warm)
        session = await one_session(warm, agent_type)
        await _pool_settled(warm)
        _, to_first, workspace = await _lifecycle(
            warm.create_workspace, lambda ws: warm.exec_true(ws["id"]), lambda ws: warm.delete_workspace(ws["id"])
        )
        if round_:
            starts.session_warm.add(session.ready_ms)
            starts.pooled_sessions += await _from_pool(warm, session.workspace_id)
            starts.first_warm.add(to_first)
            starts.pooled_creates += bool(workspace["from_warm_pool"])


async def cold_starts(bench: Bench, cold: CorralServer, starts: Starts) -> None:
    """Cold, interleaved round by round: POST session to ``active``; POST workspace + exec ``true``;
    GVisorProvider.create + .exec in this process; plain ``docker run`` + ``docker exec``, without and with a volume
    (Corral's workspaces have one)."""
    agent_type = await cold.create_agent_type("bench-cold", WORKSPACE_CONFIG)
    gvisor, plain = bench.gvisor, bench.plain
    runtime = bench.settings.gvisor_runtime

    async def provider_create() -> str:
        spec = bench.spec()
        await gvisor.create(spec)
        return spec.id

    async def provider_exec(workspace_id: str) -> None:
        result = await gvisor.exec(workspace_id, TRUE)
        if result.exit_code != 0:
            raise RuntimeError(f"true exited with {result.exit_code}")

    for round_ in range(bench.config.creates + 1):  # round 0 is the warm-up
        session = await one_session(cold, agent_type)
        http = await _lifecycle(
            cold.create_workspace, lambda ws: cold.exec_true(ws["id"]), lambda ws: cold.delete_workspace(ws["id"])
        )
        provider = await _lifecycle(provider_create, provider_exec, gvisor.destroy)
        docker = await _lifecycle(lambda: plain.run(runtime), plain.exec_true, plain.remove)
        docker_volume = await _lifecycle(lambda: plain.run(runtime, volume=True), _nothing, plain.remove)
        if round_:
            starts.session_cold.add(session.ready_ms)
            starts.running_cold.add(http[0])
            starts.first_cold.add(http[1])
            starts.running_provider.add(provider[0])
            starts.running_plain.add(docker[0])
            starts.first_plain.add(docker[1])
            starts.running_plain_volume.add(docker_volume[0])


def start_rows(bench: Bench, starts: Starts) -> None:
    """The session-ready and create rows, with their targets."""
    session_warm, session_cold = starts.session_warm.measure(), starts.session_cold.measure()
    plain_first, plain_running = starts.first_plain.measure(), starts.running_plain.measure()
    http_running, provider_running = starts.running_cold.measure(), starts.running_provider.measure()
    plain_cmd, plain_run = "docker run + docker exec (API)", "docker run -d (API)"
    first_warm = starts.first_warm.measure()

    def within(p50: float) -> Target:
        ratio = p50 / plain_running.p50
        return Target("<= 1.2x docker run (p50)", ratio <= 1.2, f"{ratio:.2f}x")

    bench.rows += [
        Row(
            "session ready (POST session -> active), gVisor, warm pool",
            session_warm,
            session_cold,
            "cold session (ratio = warm/cold)",
            Target("p50 <= 5 ms", session_warm.p50 <= 5),  # issue #16 (it was 30 ms before)
        ),
        Row("session ready (POST session -> active), gVisor, cold", session_cold, plain_running, plain_run),
        Row(
            "create -> first command, gVisor, warm (HTTP)",
            first_warm,
            plain_first,
            plain_cmd,
            Target("p50 <= 15 ms", first_warm.p50 <= 15),  # issue #16
        ),
        Row("create -> first command, gVisor, cold (HTTP)", starts.first_cold.measure(), plain_first, plain_cmd),
        Row(
            "create -> running, gVisor, cold (HTTP POST workspace)",
            http_running,
            plain_running,
            plain_run,
            within(http_running.p50),
        ),
        Row(
            "create -> running, gVisor, cold (provider.create)",
            provider_running,
            plain_running,
            plain_run,
            within(provider_running.p50),
        ),
        Row(
            "create -> running, gVisor, cold (provider.create), volume both sides",
            provider_running,
            starts.running_plain_volume.measure(),
            "docker run -d -v VOL:/workspace (API)",
        ),
    ]
    n = bench.config.creates
    runtime = bench.settings.gvisor_runtime
    bench.notes += [
        "Session ready: an agent type with a workspace, repo_source none, no setup commands. Warm: a server with "
        f"CORRAL_WARM_POOL_SIZE={bench.config.warm_pool}, the pool refilled and settled ({POOL_SETTLE_S:g} s) before "
        f"each start; {starts.pooled_sessions}/{n} sessions and {starts.pooled_creates}/{n} creates got a pooled "
        "workspace. Cold: a server without a pool, measured after the warm server was stopped. A POST that answers "
        "`active` (warm) is ready when it returns; otherwise the client polls GET session back to back "
        f"({SESSION_POLL_S * 1000:g} ms apart), so a ready time is late by at most one GET.",
        "Create: HTTP = POST /workspaces (201 = running) then POST exec `true` (argv); provider = "
        "GVisorProvider.create + .exec in the bench process; plain = create + start of a container with Corral's "
        f"hardening flags under {runtime} (no volume: `docker run -d --runtime={runtime} --network=none IMAGE sleep "
        "infinity`), then exec create + start + inspect of `true`, all through the Docker Engine API (Corral's "
        "DockerEngine: httpx on the Unix socket); the last create row compares with a plain run that also creates "
        "and mounts a named volume at /workspace, as Corral does. The cold variants are interleaved round by round.",
    ]


# --- exec and files ---------------------------------------------------------------------------------------------------


@dataclass
class _Runtime:
    """One runtime's three ways in: the provider in this process, the HTTP API, and plain Docker."""

    label: str
    provider: DockerProvider
    provider_ws: str
    http_ws: str
    plain: PlainContainer


async def _setup_runtime(
    bench: Bench, server: CorralServer, label: str, provider: DockerProvider, name: str
) -> _Runtime:
    spec = bench.spec()
    await provider.create(spec)
    http_ws = (await server.create_workspace(provider=name))["id"]
    plain = await bench.plain.run(provider.runtime_for("isolated"), volume=True)
    return _Runtime(label, provider, spec.id, http_ws, plain)


async def _teardown_runtime(bench: Bench, server: CorralServer, rt: _Runtime) -> None:
    await rt.provider.destroy(rt.provider_ws)
    await server.delete_workspace(rt.http_ws)
    await bench.plain.remove(rt.plain)


async def exec_and_files(bench: Bench, server: CorralServer) -> None:
    """Exec round trips of ``true`` and 10 MB write + read, for runc and gVisor, at the provider, over HTTP, and
    through plain ``docker exec`` / ``docker cp``."""
    runtimes: list[_Runtime] = []
    try:
        runtimes.append(await _setup_runtime(bench, server, "runc", bench.runc, "docker"))
        runtimes.append(await _setup_runtime(bench, server, "gVisor", bench.gvisor, "gvisor"))
        await _exec_loop(bench, server, runtimes)
        await _file_loop(bench, server, runtimes)
    finally:
        for rt in runtimes:
            await _teardown_runtime(bench, server, rt)


SPAWN_TIMER_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
/* Start /bin/true N times (vfork + execve + waitpid, as the spawner does) and print each in ms. */
int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 100;
    for (int i = 0; i < n; i++) {
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        pid_t pid = vfork();
        if (pid == 0) {
            char *args[] = {"/bin/true", NULL};
            execv(args[0], args);
            _exit(127);
        }
        int status;
        if (pid < 0 || waitpid(pid, &status, 0) < 0 || status != 0) return 1;
        clock_gettime(CLOCK_MONOTONIC, &b);
        printf("%.4f\n", (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6);
        usleep(2000);
    }
    return 0;
}
"""
"""A static timer run inside a workspace: what starting a process costs there, with nothing of Corral around it."""


async def _spawn_floor_inside(bench: Bench, rt: _Runtime, runs: int) -> Samples:
    """The spawn timer's samples, run ``runs`` times inside the runtime's provider workspace."""
    source, binary = bench.workdir / "spawn_timer.c", bench.workdir / "spawn_timer"
    if not binary.exists():
        source.write_text(SPAWN_TIMER_C)
        build = await asyncio.create_subprocess_exec("gcc", "-static", "-O2", "-o", str(binary), str(source))
        if await build.wait() != 0:
            raise RuntimeError("could not build the spawn timer with gcc -static")
    await rt.provider.write_file(rt.provider_ws, "/workspace/spawn_timer", binary.read_bytes())
    run = ExecRequest(f"chmod +x /workspace/spawn_timer && /workspace/spawn_timer {runs}")
    result = await rt.provider.exec(rt.provider_ws, run)
    if result.exit_code != 0:
        raise RuntimeError(f"the spawn timer failed in the {rt.label} workspace: {result.stderr[-300:]!r}")
    samples = Samples()
    for line in result.stdout.split():
        samples.add(float(line))
    return samples


async def _exec_loop(bench: Bench, server: CorralServer, runtimes: list[_Runtime]) -> None:
    samples = {(rt.label, way): Samples() for rt in runtimes for way in ("provider", "http", "plain")}

    async def provider_exec(rt: _Runtime) -> None:
        result = await rt.provider.exec(rt.provider_ws, TRUE)
        if result.exit_code != 0:
            raise RuntimeError(f"true exited with {result.exit_code}")

    async def http_exec(rt: _Runtime) -> None:
        await server.exec_true(rt.http_ws)

    async def plain_exec(rt: _Runtime) -> None:
        await bench.plain.exec_true(rt.plain)

    ways: dict[str, Callable[[_Runtime], Awaitable[None]]] = {
        "provider": provider_exec,
        "http": http_exec,
        "plain": plain_exec,
    }
    # Floors, measured in the same rounds: the cheapest call each client can make.
    http_floor, docker_floor = Samples(), Samples()
    agent_floor = {rt.label: Samples() for rt in runtimes}  # the agent stream's round trip: no process started
    for round_ in range(bench.config.execs + 1):
        for rt in runtimes:
            for way, exec_true in ways.items():
                if round_ == 0:  # warm-up
                    await exec_true(rt)
                    continue
                with samples[(rt.label, way)].time():
                    await exec_true(rt)
            if round_ > 0:
                conn = await rt.provider._agent(rt.provider_ws)  # a floor, not an API: the private connection
                with agent_floor[rt.label].time():
                    await conn.call("ping")
        with http_floor.time():
            await server.call("GET", "/healthz")
        with docker_floor.time():
            await bench.plain.engine.ping()

    inside = {rt.label: await _spawn_floor_inside(bench, rt, bench.config.execs) for rt in runtimes}
    limits = {"runc": 1.5, "gVisor": 5.0}  # issue #16
    for rt in runtimes:
        provider, http, plain = (samples[(rt.label, w)].measure() for w in ("provider", "http", "plain"))
        added = http.p50 - provider.p50
        bench.rows += [
            Row(
                f"exec `true` round trip, {rt.label}, provider",
                provider,
                plain,
                "docker exec (API)",
                Target(f"p50 <= {limits[rt.label]:g} ms", provider.p50 <= limits[rt.label]),
            ),
            Row(
                f"exec `true` round trip, {rt.label}, HTTP API",
                http,
                plain,
                "docker exec (API)",
                Target("p50 <= provider + 1 ms", added <= 1.0, f"{added:+.2f} ms"),
            ),
            Row(
                f"exec part: agent ping (its stream, no process), {rt.label}",
                agent_floor[rt.label].measure(),
                provider,
                f"exec `true`, {rt.label}, provider",
            ),
            Row(
                f"exec part: process start inside the workspace (C: vfork + execve + wait of /bin/true), {rt.label}",
                inside[rt.label].measure(),
                provider,
                f"exec `true`, {rt.label}, provider",
            ),
        ]
    if runtimes:
        runc = next((rt for rt in runtimes if rt.label == "runc"), runtimes[0])
        bench.rows += [
            Row(
                "exec part: GET /healthz (no auth, no work), same HTTP client",
                http_floor.measure(),
                samples[(runc.label, "http")].measure(),
                f"exec `true`, {runc.label}, HTTP API",
            ),
        ]
    bench.notes.append(
        f"Exec: {bench.config.execs} sequential round trips per variant (interleaved) of `true` in argv mode on a "
        "running workspace whose agent is up; provider = {GVisor,Docker}Provider.exec in the bench process; HTTP = "
        "POST exec over one keep-alive connection (corral.client._lean: h11, no httpx); plain = POST "
        "/containers/{id}/exec + POST /exec/{id}/start (attached, read to the end) + GET /exec/{id}/json, what "
        "`docker exec` does. Floors "
        f"in the same rounds: GET /healthz (no auth, no work) {http_floor.measure().p50:.2f} ms p50 through the "
        f"bench's HTTP client (httpx's async client adds about 2.5 ms per call here, hence the lean one); GET /_ping "
        f"through DockerEngine (httpx) {docker_floor.measure().p50:.2f} ms p50, and plain `docker exec` makes three "
        "such calls; a ping to the agent (its stream there and back, no process started) "
        + ", ".join(f"{label} {floor.measure().p50:.2f} ms" for label, floor in agent_floor.items())
        + " p50. After the rounds, a static C timer in each provider workspace starts /bin/true "
        f"{bench.config.execs} times (vfork + execve + waitpid, what the spawner does, 2 ms apart): the process start "
        "every exec pays, with nothing of Corral around it."
    )


async def _file_loop(bench: Bench, server: CorralServer, runtimes: list[_Runtime]) -> None:
    data = os.urandom(bench.config.file_bytes)
    archive = tar_one_file("bench.bin", data)  # built once, outside the clock, like the bytes Corral is handed
    samples = {(rt.label, way): Samples() for rt in runtimes for way in ("provider", "http", "plain")}

    async def provider_round_trip(rt: _Runtime) -> bytes:
        await rt.provider.write_file(rt.provider_ws, "/workspace/bench.bin", data)
        chunks = await rt.provider.read_file(rt.provider_ws, "/workspace/bench.bin")
        return b"".join([chunk async for chunk in chunks])

    async def http_round_trip(rt: _Runtime) -> bytes:
        await server.put_file(rt.http_ws, "bench.bin", data)
        return await server.get_file(rt.http_ws, "bench.bin")

    async def plain_round_trip(rt: _Runtime) -> bytes:
        await bench.plain.copy_in(rt.plain, "/workspace", archive)
        return await bench.plain.copy_out(rt.plain, "/workspace/bench.bin")

    ways: dict[str, Callable[[_Runtime], Awaitable[bytes]]] = {
        "provider": provider_round_trip,
        "http": http_round_trip,
        "plain": plain_round_trip,
    }
    for round_ in range(bench.config.files + 1):
        for rt in runtimes:
            for way, round_trip in ways.items():
                started = time.perf_counter()
                got = await round_trip(rt)
                elapsed = (time.perf_counter() - started) * 1000
                if got != data:
                    raise RuntimeError(
                        f"{way} on {rt.label}: read back {len(got)} bytes that differ from those written"
                    )
                if round_:
                    samples[(rt.label, way)].add(elapsed)

    size_mb = bench.config.file_bytes / 1e6
    for rt in runtimes:
        plain = samples[(rt.label, "plain")].measure()
        for way, label in (("provider", "provider"), ("http", "HTTP API")):
            bench.rows.append(
                Row(
                    f"{size_mb:g} MB write + read, {rt.label}, {label}",
                    samples[(rt.label, way)].measure(),
                    plain,
                    "docker cp in + out (API)",
                )
            )
    bench.notes.append(
        f"Files: {bench.config.files} round trips per variant of a {size_mb:g} MB random file into /workspace and "
        "back (the bytes are compared outside the clock); provider = write_file + read_file; HTTP = PUT + GET "
        "/files; plain = PUT + GET /containers/{id}/archive (the tar is built once beforehand; the file is taken out "
        "of the returned tar inside the clock), on a container with a volume at /workspace like Corral's."
    )
