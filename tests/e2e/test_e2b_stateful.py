"""The unmodified E2B SDK keeps state through Corral: pause with memory, connect (auto-resume), snapshots, forks.

As in ``test_e2b_sdk``, each test runs a plain user script that imports only ``e2b`` against a real server on gVisor.
The scripts start a counting daemon with ``setsid`` (a command's process group ends with the command) and check
that the same pid goes on counting from where it was: a restarted process would count from 1 again.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Server, serving_e2b
from tests.e2e.test_e2b_sdk import run_user_script

pytestmark = pytest.mark.e2e

API = "/api/v1/agent"

# Shared by the scripts: the counting daemon, and polling helpers (with deadlines) over the SDK.
PRELUDE = r"""
import json, time
from e2b import Sandbox, SandboxNotRunningException, SandboxQuery, SandboxState

DAEMON = (
    # The count is written aside and renamed into place, so a reader never sees the file empty mid-write.
    "setsid sh -c 'echo $$ > /tmp/pid; i=0; while :; do i=$((i+1)); echo $i > /tmp/n.new; mv /tmp/n.new /tmp/n; "
    "sleep 0.05; done' >/dev/null 2>&1 </dev/null & while [ ! -s /tmp/n ]; do sleep 0.01; done"
)

def start_daemon(sandbox):
    sandbox.commands.run(DAEMON)
    return int(sandbox.files.read("/tmp/pid"))

def count(sandbox):
    return int(sandbox.commands.run("cat /tmp/n").stdout)

def alive(sandbox, pid):
    return sandbox.commands.run(f"kill -0 {pid} && echo yes || echo no").stdout.strip() == "yes"

def counters(sandbox):
    # How many processes run the counting loop. The pattern cannot match its own command line.
    command = "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -o 'i=[$][(][(]i' | wc -l"
    return int(sandbox.commands.run(command).stdout)

def counts_on(sandbox, above, deadline_s=30):
    # The count passes `above` (what it was before), so the same counter, memory and all, is running.
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if count(sandbox) > above:
            return True
        time.sleep(0.05)
    return False

def ids(paginator):
    out = []
    while paginator.has_next:
        out += paginator.next_items()
    return out
"""


@pytest.fixture(scope="module", name="e2b_server")
def e2b_server_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One Corral server on gVisor for the module; skips (a failure under CI) without Docker or the base image."""
    with serving_e2b(tmp_path_factory, "corral-e2b-stateful") as server:
        yield server


def run(server: Server, tmp_path: Path, body: str) -> dict[str, Any]:
    """Run the prelude plus ``body`` as a user's script; returns the JSON report it printed."""
    return run_user_script(server, tmp_path, PRELUDE + textwrap.dedent(body))


def test_pause_keeps_files_and_processes_and_connect_resumes(e2b_server: Server, tmp_path: Path) -> None:
    """pause() keeps memory: the sandbox lists as paused (state filters too), a second pause answers False, and
    Sandbox.connect resumes it with /tmp/file and the same pid still counting from where it was."""
    report = run(
        e2b_server,
        tmp_path,
        """
        sandbox = Sandbox.create(allow_internet_access=False)
        try:
            sandbox.files.write("/tmp/file", "kept in /tmp")
            pid = start_daemon(sandbox)
            before = count(sandbox)
            paused = sandbox.pause()
            info = Sandbox.get_info(sandbox.sandbox_id)
            listed_paused = [s.sandbox_id for s in ids(Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED])))]
            listed_running = [s.sandbox_id for s in ids(Sandbox.list(query=SandboxQuery(state=[SandboxState.RUNNING])))]
            try:
                sandbox.commands.run("true")
                while_paused = None
            except SandboxNotRunningException as exc:
                while_paused = type(exc).__name__
            paused_again = sandbox.pause()
            again = Sandbox.connect(sandbox.sandbox_id)
            report = {
                "id": sandbox.sandbox_id, "paused": paused, "paused_again": paused_again, "state": info.state.value,
                "listed_paused": sandbox.sandbox_id in listed_paused,
                "listed_running": sandbox.sandbox_id in listed_running,
                "while_paused": while_paused,
                "state_after": again.get_info().state.value,
                "file": again.files.read("/tmp/file"),
                "pid_file": int(again.files.read("/tmp/pid")), "pid": pid, "alive": alive(again, pid),
                "first_count": count(again), "before": before, "counts_on": counts_on(again, count(again)),
                "connect_running": Sandbox.connect(sandbox.sandbox_id).get_info().state.value,
            }
        finally:
            sandbox.kill()
        print(json.dumps(report))
        """,
    )
    assert (report["paused"], report["paused_again"], report["state"]) == (True, False, "paused")
    assert (report["listed_paused"], report["listed_running"]) == (True, False)
    assert report["while_paused"] == "SandboxNotRunningException"
    assert (report["state_after"], report["connect_running"]) == ("running", "running")
    assert report["file"] == "kept in /tmp"
    assert report["pid_file"] == report["pid"] and report["alive"] is True
    assert isinstance(report["first_count"], int) and isinstance(report["before"], int)
    assert report["first_count"] >= report["before"], "the counter restarted: its memory was not kept"
    assert report["counts_on"] is True


def test_snapshot_create_from_it_list_and_delete(e2b_server: Server, tmp_path: Path) -> None:
    """create_snapshot keeps the source running; Sandbox.create(snapshot_id) and by name give sandboxes with its
    file and its process counting on; a filesystem snapshot gives the file without the process; list_snapshots
    filters by sandbox and name; delete_snapshot answers True then False."""
    report = run(
        e2b_server,
        tmp_path,
        """
        source = Sandbox.create(allow_internet_access=False)
        made = []
        try:
            source.files.write("/tmp/file", "from the source")
            pid = start_daemon(source)
            snap = source.create_snapshot(name="stateful-snap")
            at_snapshot = count(source)
            copy = Sandbox.create(snap.snapshot_id, timeout=120)
            made.append(copy)
            by_name = Sandbox.create("stateful-snap", timeout=120)
            made.append(by_name)
            copy.files.write("/tmp/file", "changed in the copy")
            disk_only = source.create_snapshot(mode="filesystem")
            cold = Sandbox.create(disk_only.snapshot_id, timeout=120)
            made.append(cold)
            everything = [s.snapshot_id for s in ids(Sandbox.list_snapshots())]
            of_source = [s.snapshot_id for s in ids(source.list_snapshots())]
            named = [s.snapshot_id for s in ids(Sandbox.list_snapshots(name="stateful-snap"))]
            of_copy = [s.snapshot_id for s in ids(copy.list_snapshots())]
            report = {
                "snapshot": snap.snapshot_id, "names": snap.names, "disk_only": disk_only.snapshot_id,
                "source_running": source.is_running(), "source_counts": counts_on(source, at_snapshot),
                "source_file": source.files.read("/tmp/file"),
                "copy_template": copy.get_info().template_id,
                "copy_file": copy.files.read("/tmp/file"), "copy_pid_alive": alive(copy, pid),
                "copy_counts": counts_on(copy, count(copy)),
                "by_name_file": by_name.files.read("/tmp/file"), "by_name_pid_alive": alive(by_name, pid),
                "cold_file": cold.files.read("/tmp/file"),
                "cold_pid_file": cold.files.read("/tmp/pid").strip(),
                "source_counters": counters(source), "cold_counters": counters(cold),
                "everything": everything, "of_source": of_source, "named": named, "of_copy": of_copy,
                "ids": [source.sandbox_id, copy.sandbox_id, by_name.sandbox_id, cold.sandbox_id],
                "deleted": Sandbox.delete_snapshot(snap.snapshot_id),
                "deleted_again": Sandbox.delete_snapshot(snap.snapshot_id),
                "deleted_disk_only": Sandbox.delete_snapshot(disk_only.snapshot_id),
            }
            report["after_delete"] = [s.snapshot_id for s in ids(Sandbox.list_snapshots())]
            report["copy_after_delete"] = copy.commands.run("cat /tmp/file").stdout
        finally:
            for sandbox in [source, *made]:
                sandbox.kill()
        print(json.dumps(report))
        """,
    )
    snapshot, disk_only = report["snapshot"], report["disk_only"]
    assert isinstance(snapshot, str) and snapshot.endswith(":default")
    assert report["names"] == ["stateful-snap:default"]
    assert (report["source_running"], report["source_counts"]) == (True, True)
    assert report["source_file"] == "from the source", "a write in the copy reached the source"
    assert report["copy_template"] == snapshot
    assert (report["copy_file"], report["copy_pid_alive"], report["copy_counts"]) == ("changed in the copy", True, True)
    assert (report["by_name_file"], report["by_name_pid_alive"]) == ("from the source", True)
    assert report["cold_file"] == "from the source" and report["cold_pid_file"]
    assert report["source_counters"] >= 1
    assert report["cold_counters"] == 0, "a sandbox from a filesystem snapshot still runs the source's processes"
    assert {snapshot, disk_only} <= set(report["everything"])
    assert set(report["of_source"]) == {snapshot, disk_only}
    assert (report["named"], report["of_copy"]) == ([snapshot], [])
    assert len(set(report["ids"])) == 4
    assert (report["deleted"], report["deleted_again"], report["deleted_disk_only"]) == (True, False, True)
    assert not {snapshot, disk_only} & set(report["after_delete"])
    assert report["copy_after_delete"] == "changed in the copy"
    corral_id = snapshot.removesuffix(":default")
    assert e2b_server.client.get(f"{API}/snapshots/{corral_id}").status_code == 404


def test_fork_gives_independent_copies_with_running_processes(e2b_server: Server, tmp_path: Path) -> None:
    """fork(count=2): two new sandboxes, each with the source's file and its process counting on; a write in one is
    seen neither by the other nor by the source, which keeps running; a paused sandbox cannot be forked."""
    report = run(
        e2b_server,
        tmp_path,
        """
        from e2b import SandboxException

        source = Sandbox.create(allow_internet_access=False, metadata={"role": "source"})
        forks = []
        try:
            source.files.write("/tmp/file", "before the fork")
            pid = start_daemon(source)
            forks = source.fork(count=2, timeout=120)
            first, second = forks
            first.files.write("/tmp/file", "written in the first fork")
            report = {
                "kinds": [type(f).__name__ for f in forks],
                "ids": [source.sandbox_id, first.sandbox_id, second.sandbox_id],
                "files": [s.files.read("/tmp/file") for s in (source, first, second)],
                "alive": [alive(s, pid) for s in (source, first, second)],
                "counting": [counts_on(s, count(s)) for s in (source, first, second)],
                "hostnames": [s.commands.run("hostname").stdout for s in (source, first, second)],
                "metadata": first.get_info().metadata,
            }
            source.pause()
            try:
                Sandbox.fork(source.sandbox_id, count=1)
                report["fork_paused"] = None
            except SandboxException as exc:
                report["fork_paused"] = str(exc)
        finally:
            for sandbox in [source, *forks]:
                if isinstance(sandbox, Sandbox):
                    sandbox.kill()
        print(json.dumps(report))
        """,
    )
    assert report["kinds"] == ["Sandbox", "Sandbox"]
    assert len(set(report["ids"])) == 3
    assert report["files"] == ["before the fork", "written in the first fork", "before the fork"]
    assert report["alive"] == [True, True, True]
    assert report["counting"] == [True, True, True]
    assert len(set(report["hostnames"])) == 3
    assert report["metadata"] == {"role": "source"}
    assert "paused" in str(report["fork_paused"])
    forked = e2b_server.client.get(f"{API}/workspaces/{report['ids'][1]}").json()
    assert forked["metadata"]["forked_from"] == report["ids"][0]


def test_timeout_pauses_with_memory_and_traffic_resumes(e2b_server: Server, tmp_path: Path) -> None:
    """With lifecycle on_timeout "pause" and auto_resume, the timeout pauses the sandbox with its memory, and the
    next command resumes it by itself, with the same process counting on."""
    report = run(
        e2b_server,
        tmp_path,
        """
        sandbox = Sandbox.create(timeout=120, allow_internet_access=False,
                                 lifecycle={"on_timeout": "pause", "auto_resume": True})
        try:
            pid = start_daemon(sandbox)
            lifecycle = sandbox.get_info().lifecycle
            before = count(sandbox)
            sandbox.set_timeout(1)
            deadline = time.monotonic() + 60
            state = None
            while time.monotonic() < deadline:
                state = Sandbox.get_info(sandbox.sandbox_id).state.value
                if state == "paused":
                    break
                time.sleep(0.1)
            report = {
                "lifecycle": lifecycle, "state": state,
                "resumed_by_command": count(sandbox) >= before,
                "state_after": Sandbox.get_info(sandbox.sandbox_id).state.value,
                "alive": alive(sandbox, pid), "counts_on": counts_on(sandbox, count(sandbox)),
            }
        finally:
            sandbox.kill()
        print(json.dumps(report))
        """,
    )
    assert report["lifecycle"] == {"on_timeout": "pause", "auto_resume": True}
    assert report["state"] == "paused"
    assert (report["resumed_by_command"], report["state_after"]) == (True, "running")
    assert (report["alive"], report["counts_on"]) == (True, True)


def test_filesystem_pause_and_reboot_resume_keep_files_only(e2b_server: Server, tmp_path: Path) -> None:
    """pause(mode="filesystem") and connect(on_resume="reboot") after a memory pause both bring the sandbox back
    from its disk: /tmp/file is there, the counting process is not."""
    report = run(
        e2b_server,
        tmp_path,
        """
        sandbox = Sandbox.create(allow_internet_access=False)
        try:
            sandbox.files.write("/tmp/file", "on disk")
            start_daemon(sandbox)
            report = {"counters_before": counters(sandbox), "fs_paused": sandbox.pause(mode="filesystem")}
            report["fs_state"] = Sandbox.get_info(sandbox.sandbox_id).state.value
            again = Sandbox.connect(sandbox.sandbox_id)
            report |= {"fs_file": again.files.read("/tmp/file"), "fs_counters": counters(again)}
            start_daemon(again)
            report["memory_paused"] = again.pause()
            rebooted = Sandbox.connect(sandbox.sandbox_id, on_resume="reboot")
            report |= {"reboot_file": rebooted.files.read("/tmp/file"), "reboot_counters": counters(rebooted)}
        finally:
            sandbox.kill()
        print(json.dumps(report))
        """,
    )
    assert (report["counters_before"], report["fs_paused"], report["fs_state"]) == (1, True, "paused")
    assert (report["fs_file"], report["fs_counters"]) == ("on disk", 0)
    assert report["memory_paused"] is True
    assert (report["reboot_file"], report["reboot_counters"]) == ("on disk", 0)


def test_errors_have_e2b_shape(e2b_server: Server, tmp_path: Path) -> None:
    """Refusals come back as the SDK's exceptions with Corral's reasons: a bad snapshot name and too many forks
    (400), an unknown snapshot to delete (False), a snapshot of a paused sandbox (409)."""
    report = run(
        e2b_server,
        tmp_path,
        """
        from e2b import SandboxException

        def error(call):
            try:
                call()
            except SandboxException as exc:
                return str(exc)
            return None

        sandbox = Sandbox.create(allow_internet_access=False)
        try:
            report = {
                "bad_name": error(lambda: sandbox.create_snapshot(name="no spaces allowed")),
                "too_many": error(lambda: sandbox.fork(count=17)),
                "unknown": Sandbox.delete_snapshot("0000000000000000:default"),
            }
            sandbox.pause()
            report["paused"] = error(lambda: Sandbox.create_snapshot(sandbox.sandbox_id))
            report["listed"] = [s.snapshot_id for s in ids(Sandbox.list_snapshots(sandbox_id=sandbox.sandbox_id))]
        finally:
            sandbox.kill()
        print(json.dumps(report))
        """,
    )
    assert str(report["bad_name"]).startswith("400: name: 'no spaces allowed' is not allowed")
    assert str(report["too_many"]).startswith("400: count: 17 is not allowed")
    assert report["unknown"] is False
    assert str(report["paused"]).startswith("409: ") and "paused" in str(report["paused"])
    assert report["listed"] == []
