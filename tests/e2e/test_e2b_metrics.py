"""``Sandbox.get_metrics`` of the unmodified E2B SDK against a real Corral server on gVisor: CPU, memory and disk
samples from the container's cgroup counters and the workspace's disk, sampled every second here."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import BASE_IMAGE, TOKEN, Server, start_server, stop_server
from tests.e2e.test_e2b_sdk import run_user_script

pytestmark = pytest.mark.e2e

MiB = 1024 * 1024


@pytest.fixture(scope="module", name="e2b_server")
def e2b_server_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server on gVisor sampling every second; skips (a failure under CI) without Docker or the base image."""
    if subprocess.run(["docker", "image", "inspect", BASE_IMAGE], capture_output=True, check=False).returncode != 0:
        pytest.skip(f"Docker engine or base image {BASE_IMAGE} not available; run `make bootstrap`")
    env = {"CORRAL_PROVIDERS": "gvisor", "CORRAL_METRICS_INTERVAL_S": "1"}
    server = start_server(tmp_path_factory.mktemp("corral-e2b-metrics"), env)
    try:
        assert server.client.get("/e2b/v2/sandboxes", headers={"X-API-KEY": TOKEN}).status_code == 200
        yield server
    finally:
        stop_server(server)


def test_get_metrics_reports_cpu_memory_and_disk(e2b_server: Server, tmp_path: Path) -> None:
    """get_metrics (instance and class method) answers ascending samples with CPUs, memory and disk; CPU use shows
    a busy loop, disk use grows by a 20 MB file, and start/end filter (start after end raises the SDK's error)."""
    report = run_user_script(
        e2b_server,
        tmp_path,
        """
        import json, time
        from datetime import datetime, timedelta, timezone
        from e2b import Sandbox

        def poll(check, what, seconds=60):
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                samples = sandbox.get_metrics()
                if check(samples):
                    return samples
                time.sleep(0.2)
            raise AssertionError(f"no {what} within {seconds} s: {samples}")

        sandbox = Sandbox.create(allow_internet_access=False)
        try:
            first = sandbox.get_metrics()
            poll(lambda s: len(s) >= 3, "three samples")
            disk_before = sandbox.get_metrics()[-1].disk_used
            sandbox.commands.run("timeout 2 sh -c 'while :; do :; done'; true")
            busy = poll(lambda s: any(m.cpu_used_pct > 0 for m in s), "CPU use")
            sandbox.commands.run("head -c 20971520 /dev/urandom > metrics-20m.bin && sync")
            grown = poll(lambda s: s[-1].disk_used >= disk_before + 20 * 1024 * 1024, "disk growth")
            samples = sandbox.get_metrics()
            by_class = Sandbox.get_metrics(sandbox.sandbox_id)
            middle = samples[len(samples) // 2].timestamp
            one_second = sandbox.get_metrics(start=middle, end=middle)
            future = sandbox.get_metrics(start=datetime.now(timezone.utc) + timedelta(hours=1))
            now = datetime.now(timezone.utc)
            try:
                sandbox.get_metrics(start=now, end=now - timedelta(hours=1))
                refused = None
            except Exception as exc:
                refused = {"class": type(exc).__name__, "message": str(exc)}
            report = {
                "first": len(first),
                "samples": [
                    {"ts": m.timestamp.timestamp(), "cpus": m.cpu_count, "cpu": m.cpu_used_pct,
                     "mem_used": m.mem_used, "mem_total": m.mem_total, "disk_used": m.disk_used,
                     "disk_total": m.disk_total}
                    for m in samples
                ],
                "max_cpu": max(m.cpu_used_pct for m in busy),
                "disk_before": disk_before, "disk_after": grown[-1].disk_used,
                "by_class": len(by_class),
                "by_class_ascending": [m.timestamp for m in by_class] == sorted(m.timestamp for m in by_class),
                "middle": int(middle.timestamp()),
                "one_second": [int(m.timestamp.timestamp()) for m in one_second],
                "future": len(future),
                "refused": refused,
            }
        finally:
            sandbox.kill()
        print(json.dumps(report))
        """,
    )
    assert report["first"] >= 1, "the first call takes a sample at once"
    samples = report["samples"]
    assert len(samples) >= 3
    timestamps = [s["ts"] for s in samples]
    assert timestamps == sorted(timestamps)
    assert len(set(timestamps)) == len(timestamps)
    for sample in samples:
        assert sample["cpus"] >= 1
        assert sample["mem_total"] > 0
        assert 0 < sample["mem_used"] <= sample["mem_total"]
        assert sample["disk_total"] > sample["disk_used"] >= 0
        assert 0.0 <= sample["cpu"] <= 100.0
    assert report["max_cpu"] > 0
    assert report["disk_after"] - report["disk_before"] >= 20 * MiB
    assert report["by_class"] >= len(samples)
    assert report["by_class_ascending"] is True
    assert report["one_second"]
    assert set(report["one_second"]) == {report["middle"]}
    assert report["future"] == 0
    assert report["refused"] is not None
    assert "start time cannot be after end time" in report["refused"]["message"]
