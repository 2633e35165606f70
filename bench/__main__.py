"""``python -m bench [--quick]``: measure Corral against plain Docker on this machine and print one table.

The table is also written as Markdown to ``bench/results/latest.md`` (gitignored). Everything the run creates
(servers, containers, volumes, images, snapshots, temporary directories) is removed at the end, also after a failure
or Ctrl-C. ``--only pause,fork`` runs some of the scenarios.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path

from bench.context import FULL, QUICK, Bench, Config
from bench.e2b import e2b_latency
from bench.latency import Starts, cold_starts, exec_and_files, start_rows, warm_starts
from bench.memory import idle_memory
from bench.report import machine_info, render, write_markdown
from bench.scale import sessions_at_once
from bench.stateful import forks_and_snapshots, pause_resume, setup_sessions
from bench.tools import tool_latency
from corral.errors import CorralError
from corral.providers._docker_engine import DockerAPIError

DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "latest.md"
SCENARIOS: tuple[str, ...] = ("starts", "exec", "tools", "e2b", "burst", "memory", "pause", "fork", "setup")
"""What ``--only`` picks from, in the order they run."""
GROUPS = {"stateful": ("pause", "fork", "setup")}


def parse_args(argv: list[str] | None = None) -> tuple[Config, Path, tuple[str, ...]]:
    """The run's configuration, where the Markdown goes, and the scenarios to run."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="smaller counts (a few minutes)")
    parser.add_argument("--sessions", type=int, help="sessions started at once (default 50; quick 10)")
    parser.add_argument(
        "--sessions-warm-pool", type=int, help="CORRAL_WARM_POOL_SIZE for the sessions-at-once server (default 0: cold)"
    )
    parser.add_argument("--execs", type=int, help="exec round trips per variant (default 200; quick 50)")
    parser.add_argument("--creates", type=int, help="creates and session starts per variant (default 30; quick 8)")
    parser.add_argument("--files", type=int, help="10 MB file round trips per variant (default 30; quick 2)")
    parser.add_argument("--idle", type=int, help="idle workspaces for the memory measurement (default 10; quick 4)")
    parser.add_argument("--cycles", type=int, help="pause/resume cycles per variant (default 20; quick 5)")
    parser.add_argument("--tool-calls", type=int, help="rounds of tool calls (default 100; quick 15)")
    parser.add_argument(
        "--only",
        metavar="NAMES",
        help=f"comma-separated scenarios to run, of {', '.join(SCENARIOS)} (stateful = pause,fork,setup); default all",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"Markdown output (default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    scenarios = SCENARIOS
    if args.only is not None:
        asked = {name.strip() for name in args.only.split(",") if name.strip()}
        unknown = sorted(asked - set(SCENARIOS) - set(GROUPS))
        if unknown or not asked:
            parser.error(
                f"--only: {', '.join(unknown) or 'nothing'} is not a scenario; pick from "
                f"{', '.join([*SCENARIOS, *GROUPS])}"
            )
        picked = set().union(*(GROUPS.get(name, (name,)) for name in asked))
        scenarios = tuple(name for name in SCENARIOS if name in picked)
    overrides = {
        "burst": args.sessions,
        "burst_pool": args.sessions_warm_pool,
        "execs": args.execs,
        "creates": args.creates,
        "files": args.files,
        "idle": args.idle,
        "cycles": args.cycles,
        "tool_calls": args.tool_calls,
    }
    config = dataclasses.replace(QUICK if args.quick else FULL, **{k: v for k, v in overrides.items() if v is not None})
    for name in ("burst", "execs", "creates", "files", "idle", "cycles", "tool_calls"):
        if getattr(config, name) < 1:
            parser.error(f"--{name}: must be at least 1")
    if config.burst_pool < 0:
        parser.error("--sessions-warm-pool: must not be negative")
    return config, args.out, scenarios


async def _step(name: str, work: Awaitable[None]) -> None:
    started = time.monotonic()
    print(f"bench: {name} ...", file=sys.stderr, flush=True)
    await work
    print(f"bench: {name} done in {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)


async def _preflight(bench: Bench) -> str:
    """Fail early, with the fix, when Docker, runsc or the image is missing. Returns the engine's version line."""
    engine = bench.plain.engine
    try:
        version = await engine.request("GET", "/version")
    except DockerAPIError as exc:
        raise SystemExit(f"bench: {exc.message}; run `make bootstrap`") from exc
    if not await engine.image_exists(bench.image):
        raise SystemExit(f"bench: image {bench.image} is missing; run `make bootstrap`")
    try:
        await bench.gvisor.check_runtime()
    except CorralError as exc:
        raise SystemExit(f"bench: {exc.message}") from exc
    return f"Docker Engine {version.get('Version')} (API {version.get('ApiVersion')})"


async def run(config: Config, out: Path, scenarios: tuple[str, ...] = SCENARIOS) -> None:
    """The scenarios in order, then the table on stdout and in ``out``."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as tmp:
        async with Bench(config, Path(tmp)) as bench:
            machine = machine_info(await _preflight(bench))
            for key, value in machine:
                print(f"{key:>14}: {value}", file=sys.stderr)
            try:
                if "starts" in scenarios:
                    cold, warm = await asyncio.gather(
                        bench.start_server("cold", {}),
                        bench.start_server("warm", {"CORRAL_WARM_POOL_SIZE": str(config.warm_pool)}),
                    )
                    starts = Starts()
                    await _step("warm starts (sessions and creates)", warm_starts(bench, warm, starts))
                    await bench.stop_server(warm)
                    await _step("cold starts (sessions and creates)", cold_starts(bench, cold, starts))
                    start_rows(bench, starts)
                elif "exec" in scenarios:
                    cold = await bench.start_server("cold", {})
                if "exec" in scenarios:
                    await _step("exec and file round trips", exec_and_files(bench, cold))
                if {"starts", "exec"} & set(scenarios):
                    await bench.stop_server(cold)
                if "tools" in scenarios:
                    await _step(f"tool calls, {config.tool_calls} rounds", tool_latency(bench))
                if "e2b" in scenarios:
                    await _step("E2B SDK against Corral's own API", e2b_latency(bench))
                if "burst" in scenarios:
                    await _step(f"{config.burst} sessions at once", sessions_at_once(bench))
                if "memory" in scenarios:
                    await _step(f"memory of {config.idle} idle workspaces", idle_memory(bench))
                if "pause" in scenarios:
                    await _step(f"pause/resume, {config.cycles} cycles per variant", pause_resume(bench))
                if "fork" in scenarios:
                    await _step(f"snapshots and fork x{config.forks}", forks_and_snapshots(bench))
                if "setup" in scenarios:
                    await _step(f"sessions with a {config.setup_s:g} s setup", setup_sessions(bench))
            except Exception:
                for server in bench.servers:
                    print(f"--- log of the {server.name} server ---\n{server.log_tail()}", file=sys.stderr)
                raise
            rows, notes = bench.rows, bench.notes

    kind = "quick run (--quick)" if config.quick else "full run"
    if scenarios != SCENARIOS:
        kind += f", only {','.join(scenarios)}"
    title = f"Corral vs plain Docker: {kind}, {time.monotonic() - started:.0f} s"
    table = render(rows)
    notes = [
        "ratio = Corral p50 / plain p50, both measured in this run; p95 unless a cell says otherwise.",
        *notes,
    ]
    print(f"\n{title}\n")
    for key, value in machine:
        print(f"{key:>14}: {value}")
    print(f"\n{table}\n")
    for note in notes:
        print(f"- {note}")
    write_markdown(out, title=title, machine=machine, table=table, notes=notes)
    print(f"\nbench: written to {out}", file=sys.stderr)


async def _run_until_signalled(config: Config, out: Path, scenarios: tuple[str, ...]) -> None:
    """:func:`run`, cancelled (so every clean-up runs) on SIGTERM as on Ctrl-C."""
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    await run(config, out, scenarios)


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m bench``."""
    logging.basicConfig(level=logging.INFO, format="bench: %(message)s")
    # The in-process DockerProvider logs a reduced-isolation warning on every create; expected here, not news.
    logging.getLogger("corral").setLevel(logging.ERROR)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    config, out, scenarios = parse_args(argv)
    try:
        asyncio.run(_run_until_signalled(config, out, scenarios))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("bench: interrupted; everything it created has been removed", file=sys.stderr)
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
