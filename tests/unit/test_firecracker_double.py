"""The Firecracker API double's pause, snapshot and Ctrl-Alt-Del rules, its version and its I/O errors, through
the real API client over a real Unix socket (the guest is :class:`NoGuest`: nothing boots)."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from corral.microvm.api_client import FirecrackerAPIError, FirecrackerClient
from corral.testing.firecracker import ApiDouble, ApiFault, NoGuest, start_api_server
from corral.testing.firecracker.api import (
    LOAD_NOT_ALLOWED,
    POST_BOOT_ONLY,
    PRE_BOOT_ONLY,
    RUNNING_ONLY_SNAPSHOT,
    STATE_FORMAT,
    VMM_VERSION,
)
from corral.testing.firecracker.schema import SCHEMAS

pytestmark = pytest.mark.unit

MIB = 1024 * 1024
LOAD_FAILED = "Load snapshot error: Failed to restore from snapshot: "


class Taps:
    """A TAP opener double: the names in ``existing`` open (as /dev/null), others fail like a missing device."""

    def __init__(self, *existing: str) -> None:
        self.existing = set(existing)
        self.opened: list[str] = []

    def __call__(self, name: str) -> int:
        if name not in self.existing:
            raise ApiFault(f"Network config error: Could not create the network device: no device {name}")
        self.opened.append(name)
        return os.open(os.devnull, os.O_RDONLY)


class Served:
    """One ApiDouble on its own socket, and a client of it."""

    def __init__(self, api: ApiDouble, path: str) -> None:
        self.api = api
        self.path = path
        self.server, self.thread = start_api_server(path, api)
        self.client = FirecrackerClient(path)

    @property
    def guest(self) -> NoGuest:
        assert isinstance(self.api.guest, NoGuest)
        return self.api.guest

    async def close(self) -> None:
        await self.client.aclose()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
        self.api.close()


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    """A kernel, a disk, a vsock path and a snapshot directory the double can use."""
    kernel, disk = tmp_path / "vmlinux", tmp_path / "rootfs.ext4"
    kernel.write_bytes(b"k")
    disk.write_bytes(b"\0" * 4096)
    (tmp_path / "snap").mkdir()
    return {
        "kernel": str(kernel),
        "disk": str(disk),
        "vsock": str(tmp_path / "v.sock"),
        "state": str(tmp_path / "snap" / "vmstate"),
        "memory": str(tmp_path / "snap" / "memory"),
    }


@pytest.fixture
async def serve(tmp_path: Path) -> AsyncIterator[Callable[..., Served]]:
    """Starts doubles (``serve(guest=..., taps=...)``) on sockets in tmp_path; closes them afterwards."""
    made: list[Served] = []

    def make(*, guest: NoGuest | None = None, taps: Taps | None = None) -> Served:
        api = ApiDouble(instance_id=f"vm-{len(made)}", guest=guest or NoGuest(), tap_opener=taps or Taps("fctap0"))
        served = Served(api, str(tmp_path / f"api{len(made)}.sock"))
        made.append(served)
        return served

    yield make
    for served in made:
        await served.close()


async def boot(vm: Served, files: dict[str, str], *, mem_size_mib: int = 64) -> None:
    """Every pre-boot call the VM driver makes, then InstanceStart."""
    await vm.client.put_machine_config(vcpu_count=1, mem_size_mib=mem_size_mib)
    await vm.client.put_boot_source(kernel_image_path=files["kernel"], boot_args="console=ttyS0")
    await vm.client.put_drive("rootfs", path_on_host=files["disk"], is_root_device=True, is_read_only=False)
    await vm.client.put_network_interface("eth0", host_dev_name="fctap0", guest_mac="06:00:ac:1f:00:02")
    await vm.client.put_vsock(guest_cid=7, uds_path=files["vsock"])
    await vm.client.start()


def _exists(path: str) -> bool:
    return os.path.exists(path)


def _read_json(path: str) -> Any:
    return json.loads(Path(path).read_text())


async def fault(call: Any) -> FirecrackerAPIError:
    """The API error a call raises."""
    with pytest.raises(FirecrackerAPIError) as caught:
        await call
    return caught.value


async def test_claimed_version_matches_the_fields_accepted(serve: Callable[..., Served]) -> None:
    """The double reports 1.12.0 and accepts 1.12's fields only: network_overrides yes, later fields no."""
    vm = serve()
    assert await vm.client.request("GET", "/version") == {"firecracker_version": VMM_VERSION}
    assert VMM_VERSION == "1.12.0-corral-double"
    assert (await vm.client.describe_instance())["vmm_version"] == VMM_VERSION
    assert "network_overrides" in SCHEMAS["SnapshotLoadParams"]
    assert not {"vsock_override", "clock_realtime", "track_dirty_pages"} & set(SCHEMAS["SnapshotLoadParams"])
    assert "mtu" not in SCHEMAS["NetworkInterface"]


async def test_pause_and_resume_after_boot(serve: Callable[..., Served], files: dict[str, str]) -> None:
    """PATCH /vm pauses and resumes the guest after InstanceStart, idempotently; other states are refused."""
    vm = serve()
    assert (await fault(vm.client.patch_vm("Paused"))).fault_message == POST_BOOT_ONLY
    await boot(vm, files)
    await vm.client.patch_vm("Paused")
    await vm.client.patch_vm("Paused")
    assert (await vm.client.state(), vm.guest.paused) == ("Paused", True)
    await vm.client.patch_vm("Resumed")
    await vm.client.patch_vm("Resumed")
    assert (await vm.client.state(), vm.guest.paused) == ("Running", False)
    assert (
        "unknown variant `Stopped`"
        in (await fault(vm.client.request("PATCH", "/vm", {"state": "Stopped"}))).fault_message
    )


async def test_snapshot_create_needs_a_paused_vm_and_writes_both_files(
    serve: Callable[..., Served], files: dict[str, str], tmp_path: Path
) -> None:
    """A running VM is refused; a paused one gets its disk flushed, a JSON state file and a sparse memory file."""
    vm = serve()
    await boot(vm, files, mem_size_mib=64)
    running = await fault(vm.client.create_snapshot(snapshot_path=files["state"], mem_file_path=files["memory"]))
    assert running.fault_message == RUNNING_ONLY_SNAPSHOT
    assert not _exists(files["state"])
    await vm.client.patch_vm("Paused")
    diff = {"snapshot_type": "Diff", "snapshot_path": files["state"], "mem_file_path": files["memory"]}
    assert (
        "Diff snapshots are not allowed"
        in (await fault(vm.client.request("PUT", "/snapshot/create", diff))).fault_message
    )
    nowhere = str(tmp_path / "missing" / "vmstate")
    assert (
        await fault(vm.client.create_snapshot(snapshot_path=nowhere, mem_file_path=files["memory"]))
    ).fault_message == (
        "Create snapshot error: Cannot perform open on the snapshot backing file: "
        "No such file or directory (os error 2)"
    )
    flushes = vm.guest.flushes
    await vm.client.create_snapshot(snapshot_path=files["state"], mem_file_path=files["memory"])
    assert vm.guest.flushes == flushes + 1, "the guest's writes reach its disk before the snapshot"
    state = _read_json(files["state"])
    assert state["format"] == STATE_FORMAT
    assert state["drives"][0]["path_on_host"] == files["disk"]
    assert state["vsock"] == {"guest_cid": 7, "uds_path": files["vsock"]}
    memory = os.stat(files["memory"])
    assert memory.st_size == 64 * MIB
    assert memory.st_blocks * 512 < MIB, "the memory file should be sparse"
    assert await vm.client.state() == "Paused"


async def _snapshot(vm: Served, files: dict[str, str]) -> None:
    await boot(vm, files)
    await vm.client.patch_vm("Paused")
    await vm.client.create_snapshot(snapshot_path=files["state"], mem_file_path=files["memory"])


async def test_snapshot_load_restores_devices_on_an_overridden_tap(
    serve: Callable[..., Served], files: dict[str, str]
) -> None:
    """A fresh process loads the snapshot: same drive and vsock, the interface on the override's TAP device, no
    boot source; with resume_vm the guest boots and the VM runs."""
    source = serve()
    await _snapshot(source, files)
    await source.close()  # frees the vsock socket path, which the load binds again
    taps = Taps("fctap1")
    restored = serve(taps=taps)
    await restored.client.load_snapshot(
        snapshot_path=files["state"],
        mem_file_path=files["memory"],
        resume_vm=True,
        network_overrides={"eth0": "fctap1"},
    )
    assert await restored.client.state() == "Running"
    assert (restored.guest.started, restored.guest.boots) == (True, 1)
    assert taps.opened == ["fctap1"]
    config = await restored.client.request("GET", "/vm/config")
    assert config is not None
    assert config["boot-source"] == {}
    assert config["drives"][0]["path_on_host"] == files["disk"]
    assert config["network-interfaces"][0]["host_dev_name"] == "fctap1"
    assert config["vsock"]["uds_path"] == files["vsock"]
    assert _exists(files["vsock"])
    assert (await fault(restored.client.start())).fault_message == PRE_BOOT_ONLY


async def test_load_without_resume_stays_paused_until_resumed(
    serve: Callable[..., Served], files: dict[str, str]
) -> None:
    """resume_vm false leaves the loaded VM paused and its guest not running; PATCH /vm Resumed starts it."""
    source = serve()
    await _snapshot(source, files)
    await source.close()
    restored = serve()
    await restored.client.load_snapshot(snapshot_path=files["state"], mem_file_path=files["memory"], resume_vm=False)
    assert (await restored.client.state(), restored.guest.started) == ("Paused", False)
    await restored.client.patch_vm("Resumed")
    assert (await restored.client.state(), restored.guest.boots) == ("Running", 1)


async def test_load_is_refused_after_boot_configuration(serve: Callable[..., Served], files: dict[str, str]) -> None:
    """Logger and metrics may come before a load; machine configuration may not (and that refusal is not fatal)."""
    source = serve()
    await _snapshot(source, files)
    await source.close()
    configured = serve()
    await configured.client.request("PUT", "/metrics", {"metrics_path": files["state"] + ".metrics"})
    await configured.client.put_machine_config(vcpu_count=1, mem_size_mib=64)
    error = await fault(
        configured.client.load_snapshot(snapshot_path=files["state"], mem_file_path=files["memory"], resume_vm=True)
    )
    assert error.fault_message == LOAD_NOT_ALLOWED
    assert not configured.api.fatal
    fresh = serve()
    await fresh.client.request("PUT", "/metrics", {"metrics_path": files["state"] + ".metrics2"})
    await fresh.client.load_snapshot(snapshot_path=files["state"], mem_file_path=files["memory"], resume_vm=True)
    assert await fresh.client.state() == "Running"


@pytest.mark.parametrize(
    ("break_it", "message"),
    [
        ("state", f"{LOAD_FAILED}Failed to get snapshot state from file: Failed to open snapshot file: No such file"),
        ("memory", f"{LOAD_FAILED}Failed to load guest memory: Error creating guest memory from file: Failed to load"),
        ("disk", f"{LOAD_FAILED}Failed to build microVM from snapshot: Cannot restore devices: VirtioBlock: Error"),
        ("vsock", "Error binding to the host-side Unix socket"),
        ("tap", f"{LOAD_FAILED}Failed to build microVM from snapshot: Cannot restore devices: "),
    ],
)
async def test_failed_loads_are_refused_and_fatal(
    serve: Callable[..., Served], files: dict[str, str], break_it: str, message: str
) -> None:
    """Missing state, memory or disk files, a vsock path in use or a missing TAP fail the load and end the process."""
    source = serve()
    await _snapshot(source, files)
    if break_it != "vsock":
        await source.close()
    if break_it in ("state", "memory", "disk"):
        os.unlink(files[break_it])
    restored = serve(taps=Taps() if break_it == "tap" else Taps("fctap0"))
    error = await fault(
        restored.client.load_snapshot(snapshot_path=files["state"], mem_file_path=files["memory"], resume_vm=True)
    )
    assert message in error.fault_message
    assert error.fault_message.startswith(LOAD_FAILED)
    assert restored.api.fatal, "Firecracker ends the process after a failed load"
    assert not restored.guest.started


async def test_ctrl_alt_del_is_accepted_even_when_the_guest_cannot_see_it(
    serve: Callable[..., Served], files: dict[str, str]
) -> None:
    """Without a keyboard driver the keystroke is accepted (204) and lost; while paused it waits for the resume."""
    deaf = serve(guest=NoGuest(keyboard=False))
    await boot(deaf, files)
    await deaf.client.send_ctrl_alt_del()
    assert (deaf.api.lost_keys, deaf.guest.exited()) == (1, False)
    await deaf.close()
    hearing = serve()
    await boot(hearing, files)
    await hearing.client.patch_vm("Paused")
    await hearing.client.send_ctrl_alt_del()
    assert not hearing.guest.exited(), "a paused guest runs no code"
    await hearing.client.patch_vm("Resumed")
    assert hearing.guest.exited()


async def test_an_os_error_inside_the_double_is_a_400(serve: Callable[..., Served], files: dict[str, str]) -> None:
    """An OSError while serving a call answers 400 with a prefixed fault message and keeps the connection usable."""

    def denied(name: str) -> int:
        raise OSError(errno.EACCES, os.strerror(errno.EACCES), name)

    vm = serve()
    vm.api.tap_opener = denied
    error = await fault(vm.client.put_network_interface("eth0", host_dev_name="fctap0", guest_mac=None))
    assert (error.status, error.fault_message) == (400, "Network config error: Permission denied (os error 13)")
    assert await vm.client.state() == "Not started"
