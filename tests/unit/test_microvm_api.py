"""The Firecracker API client against the API double, over a real Unix socket: paths, bodies, boot-state rules."""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.microvm.api_client import FirecrackerAPIError, FirecrackerClient, FirecrackerUnreachableError
from corral.testing.firecracker import ApiDouble, ApiFault, NoGuest, start_api_server
from corral.testing.firecracker.api import POST_BOOT_ONLY, PRE_BOOT_ONLY

pytestmark = pytest.mark.unit


class Taps:
    """A TAP opener double: the names in ``existing`` open (as /dev/null), others fail like a missing device."""

    def __init__(self, *existing: str) -> None:
        self.existing = set(existing)
        self.opened: list[str] = []

    def __call__(self, name: str) -> int:
        if name not in self.existing:
            raise ApiFault(f"Could not create the network device: Open tap device failed: no device {name}")
        self.opened.append(name)
        return os.open(os.devnull, os.O_RDONLY)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    """A kernel and a disk file the double can find."""
    kernel, disk = tmp_path / "vmlinux", tmp_path / "rootfs.ext4"
    kernel.write_bytes(b"k")
    disk.write_bytes(b"\0" * 4096)
    return {"kernel": str(kernel), "disk": str(disk), "vsock": str(tmp_path / "v.sock")}


@pytest.fixture
def double(tmp_path: Path) -> Iterator[tuple[ApiDouble, str]]:
    """The API double served on a Unix socket in a background thread."""
    api = ApiDouble(instance_id="vm-1", guest=NoGuest(), tap_opener=Taps("fctap0"))
    path = str(tmp_path / "api.sock")
    server, thread = start_api_server(path, api)
    yield api, path
    server.shutdown()
    server.server_close()
    thread.join(5)
    api.close()


@pytest.fixture
async def client(double: tuple[ApiDouble, str]) -> AsyncIterator[FirecrackerClient]:
    """A client of the double."""
    async with FirecrackerClient(double[1]) as fc:
        yield fc


def _exists(path: str) -> bool:
    return os.path.exists(path)


async def configure(client: FirecrackerClient, files: dict[str, str]) -> None:
    """Every pre-boot call the VM driver makes."""
    await client.put_machine_config(vcpu_count=2, mem_size_mib=4096)
    await client.put_boot_source(kernel_image_path=files["kernel"], boot_args="console=ttyS0 reboot=k")
    await client.put_drive("rootfs", path_on_host=files["disk"], is_root_device=True, is_read_only=False)
    await client.put_network_interface("eth0", host_dev_name="fctap0", guest_mac="06:00:ac:1f:00:02")
    await client.put_vsock(guest_cid=3, uds_path=files["vsock"])


async def fault(call: Any) -> FirecrackerAPIError:
    """The API error a call raises."""
    with pytest.raises(FirecrackerAPIError) as caught:
        await call
    return caught.value


async def test_full_boot_sequence(
    client: FirecrackerClient, double: tuple[ApiDouble, str], files: dict[str, str]
) -> None:
    """The driver's calls are accepted in order, InstanceStart moves the state to Running, config is kept."""
    api, _ = double
    assert await client.state() == "Not started"
    await configure(client, files)
    await client.start()
    assert await client.state() == "Running"
    assert api.guest.started  # type: ignore[attr-defined]
    config = await client.request("GET", "/vm/config")
    assert config is not None
    assert config["machine-config"] == {"vcpu_count": 2, "mem_size_mib": 4096, "smt": False}
    assert config["drives"] == [
        {"drive_id": "rootfs", "path_on_host": files["disk"], "is_root_device": True, "is_read_only": False}
    ]
    assert config["network-interfaces"] == [
        {"iface_id": "eth0", "host_dev_name": "fctap0", "guest_mac": "06:00:ac:1f:00:02"}
    ]
    assert config["vsock"] == {"guest_cid": 3, "uds_path": files["vsock"]}
    assert _exists(files["vsock"]), "the vsock socket is bound at PUT /vsock, as Firecracker does"
    await client.send_ctrl_alt_del()
    assert api.guest.exited()


async def test_custom_machine_config(client: FirecrackerClient) -> None:
    """4 vCPUs and 8 GiB are accepted and reported back by GET /machine-config."""
    await client.put_machine_config(vcpu_count=4, mem_size_mib=8192)
    assert await client.get_machine_config() == {"vcpu_count": 4, "mem_size_mib": 8192, "smt": False}


VCPUS = (
    "Machine config error: The number of vCPUs must be greater than 0, less than 32 and must be 1 or an even number "
    "if SMT is enabled."
)
DESERIALIZE = "An error occurred when deserializing the json body of a request: "


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/boot-source", {"boot_args": "x"}, f"{DESERIALIZE}missing field `kernel_image_path`"),
        ("/machine-config", {"vcpu_count": 2}, f"{DESERIALIZE}missing field `mem_size_mib`"),
        ("/machine-config", {"vcpu_count": 2, "mem_size_mib": 64, "cpus": 4}, f"{DESERIALIZE}unknown field `cpus`"),
        ("/machine-config", {"vcpu_count": "2", "mem_size_mib": 64}, 'invalid type: string "2", expected u64'),
        ("/machine-config", {"vcpu_count": True, "mem_size_mib": 64}, "invalid type: boolean `true`"),
        ("/machine-config", {"vcpu_count": 33, "mem_size_mib": 64}, VCPUS),
        ("/machine-config", {"vcpu_count": 0, "mem_size_mib": 64}, VCPUS),
        ("/machine-config", {"vcpu_count": 3, "mem_size_mib": 64, "smt": True}, VCPUS),
        (
            "/machine-config",
            {"vcpu_count": 1, "mem_size_mib": 0},
            "Machine config error: The memory size (MiB) is either 0, or not a multiple of the configured page size.",
        ),
        ("/machine-config", {"vcpu_count": 1, "mem_size_mib": 64, "huge_pages": "Transparent"}, "unknown variant"),
        ("/drives/rootfs", {"drive_id": "root", "is_root_device": True}, "does not match the id from the body"),
        ("/drives/rootfs", {"drive_id": "rootfs", "is_root_device": True}, "missing field `path_on_host`"),
        ("/network-interfaces/eth0", {"iface_id": "eth0"}, "missing field `host_dev_name`"),
        # mtu came with Firecracker 1.16; the double enforces 1.12, which refuses it as an unknown field.
        (
            "/network-interfaces/eth0",
            {"iface_id": "eth0", "host_dev_name": "fctap0", "mtu": 1400},
            "unknown field `mtu`",
        ),
        ("/vsock", {"guest_cid": 2, "uds_path": "/tmp/x"}, "Vsock config error: "),
        ("/vsock", {"uds_path": "/tmp/x"}, "missing field `guest_cid`"),
        ("/actions", {"action_type": "Reboot"}, "unknown variant `Reboot`"),
        ("/actions", {}, "missing field `action_type`"),
        ("/actions", [1], "invalid type: sequence"),
        ("/snapshot/load", {"mem_file_path": "m"}, "missing field `snapshot_path`"),
        ("/snapshot/load", {"snapshot_path": "s"}, "either `mem_backend` or `mem_file_path` is required"),
        (
            "/snapshot/load",
            {"snapshot_path": "s", "mem_file_path": "m", "mem_backend": {"backend_type": "File", "backend_path": "m"}},
            "either `mem_backend` or `mem_file_path` exclusively is required",
        ),
        ("/snapshot/load", {"snapshot_path": "s", "mem_file_path": "m", "track_dirty_pages": True}, "unknown field"),
        (
            "/snapshot/load",
            {"snapshot_path": "s", "mem_backend": {"backend_path": "m"}},
            "missing field `backend_type`",
        ),
    ],
)
async def test_bodies_are_checked_like_firecracker(
    client: FirecrackerClient, path: str, body: Any, message: str
) -> None:
    """Missing, unknown and mistyped fields and out-of-range values are 400s with Firecracker's fault message."""
    error = await fault(client.request("PUT", path, body))
    assert error.status == 400
    assert message in error.fault_message
    assert error.fault_message in str(error)


async def test_files_and_devices_must_exist(client: FirecrackerClient, files: dict[str, str], tmp_path: Path) -> None:
    """A missing kernel, backing file or TAP device is refused when it is configured, not at start."""
    missing = str(tmp_path / "missing")
    assert (await fault(client.put_boot_source(kernel_image_path=missing, boot_args=""))).fault_message == (
        "Boot source error: The kernel file cannot be opened: No such file or directory (os error 2)"
    )
    assert (
        await fault(client.put_drive("rootfs", path_on_host=missing, is_root_device=True))
    ).fault_message.startswith("Drive config error: Unable to create the virtio block device: ")
    assert (
        "Open tap device failed"
        in (await fault(client.put_network_interface("eth0", host_dev_name="nosuchtap", guest_mac=None))).fault_message
    )


async def test_one_root_device_and_distinct_taps(client: FirecrackerClient, files: dict[str, str]) -> None:
    """A second root drive, or a TAP device already used by another interface, is refused."""
    await client.put_drive("rootfs", path_on_host=files["disk"], is_root_device=True)
    assert (await fault(client.put_drive("other", path_on_host=files["disk"], is_root_device=True))).fault_message == (
        "Drive config error: A root block device already exists!"
    )
    await client.put_drive("data", path_on_host=files["disk"], is_root_device=False)
    await client.put_network_interface("eth0", host_dev_name="fctap0", guest_mac=None)
    assert (
        await fault(client.put_network_interface("eth1", host_dev_name="fctap0", guest_mac=None))
    ).fault_message.startswith("Network config error: ")
    assert (
        "invalid MAC"
        in (await fault(client.put_network_interface("eth0", host_dev_name="fctap0", guest_mac="zz:00"))).fault_message
    )


async def test_vsock_socket_must_be_free(client: FirecrackerClient, files: dict[str, str]) -> None:
    """PUT /vsock binds uds_path, so a path that already exists is refused with the bind error."""
    with socket.socket(socket.AF_UNIX) as squatter:
        squatter.bind(files["vsock"])
        error = await fault(client.put_vsock(guest_cid=3, uds_path=files["vsock"]))
    assert error.fault_message.startswith(
        "Vsock config error: Cannot create backend for vsock device: Error binding to the host-side Unix socket: "
    )


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("PUT", "/machine-config", {"vcpu_count": 1, "mem_size_mib": 128}),
        ("PATCH", "/machine-config", {"vcpu_count": 1, "mem_size_mib": 128}),
        ("PUT", "/boot-source", {"kernel_image_path": "KERNEL"}),
        (
            "PUT",
            "/drives/rootfs",
            {"drive_id": "rootfs", "path_on_host": "DISK", "is_root_device": True, "is_read_only": False},
        ),
        ("PUT", "/network-interfaces/eth0", {"iface_id": "eth0", "host_dev_name": "fctap0"}),
        ("PUT", "/vsock", {"guest_cid": 4, "uds_path": "VSOCK2"}),
        ("PUT", "/actions", {"action_type": "InstanceStart"}),
        ("PUT", "/snapshot/load", {"snapshot_path": "s", "mem_file_path": "m"}),
    ],
)
async def test_pre_boot_calls_are_refused_after_start(
    client: FirecrackerClient, files: dict[str, str], method: str, path: str, body: dict[str, Any]
) -> None:
    """Configuration calls and a second InstanceStart are refused once the microVM runs."""
    await configure(client, files)
    await client.start()
    replaced = {
        k: {"KERNEL": files["kernel"], "DISK": files["disk"], "VSOCK2": files["vsock"] + "2"}.get(v, v)
        if isinstance(v, str)
        else v
        for k, v in body.items()
    }
    error = await fault(client.request(method, path, replaced))
    assert (error.status, error.fault_message) == (400, PRE_BOOT_ONLY)


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("PUT", "/actions", {"action_type": "SendCtrlAltDel"}),
        ("PATCH", "/drives/rootfs", {"drive_id": "rootfs"}),
        ("PATCH", "/network-interfaces/eth0", {"iface_id": "eth0"}),
        ("PATCH", "/vm", {"state": "Paused"}),
        ("PUT", "/snapshot/create", {"snapshot_path": "s", "mem_file_path": "m"}),
    ],
)
async def test_post_boot_calls_are_refused_before_start(
    client: FirecrackerClient, method: str, path: str, body: dict[str, Any]
) -> None:
    """Ctrl-Alt-Del, drive and interface updates and pausing need a started microVM."""
    error = await fault(client.request(method, path, body))
    assert (error.status, error.fault_message) == (400, POST_BOOT_ONLY)


async def test_post_boot_updates_after_start(client: FirecrackerClient, files: dict[str, str], tmp_path: Path) -> None:
    """After start a drive can be pointed at another file and the VM paused and resumed."""
    await configure(client, files)
    await client.start()
    other = tmp_path / "other.ext4"
    other.write_bytes(b"\0" * 4096)
    await client.patch_drive("rootfs", path_on_host=str(other))
    await client.request("PATCH", "/vm", {"state": "Paused"})
    assert await client.state() == "Paused"
    await client.request("PATCH", "/vm", {"state": "Resumed"})
    assert await client.state() == "Running"


async def test_start_needs_a_kernel(client: FirecrackerClient) -> None:
    """InstanceStart without a boot source is refused."""
    error = await fault(client.start())
    assert error.fault_message == "Start microvm error: Cannot start microvm without kernel configuration."


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/nope"), ("DELETE", "/vsock"), ("PUT", "/drives"), ("PUT", "/drives/a/b"), ("PUT", "/snapshot/take")],
)
async def test_unknown_paths_are_400(client: FirecrackerClient, method: str, path: str) -> None:
    """Paths and methods outside the published API are 400 "Invalid request method and/or path"."""
    error = await fault(client.request(method, path, {} if method == "PUT" else None))
    assert error.status == 400
    assert error.fault_message == f"Invalid request method and/or path: {method} {path}."


async def test_unreachable_socket(tmp_path: Path) -> None:
    """A socket that does not exist raises FirecrackerUnreachableError, also after wait_ready's deadline."""
    async with FirecrackerClient(str(tmp_path / "absent.sock"), timeout_s=0.5) as client:
        with pytest.raises(FirecrackerUnreachableError, match=r"absent\.sock"):
            await client.describe_instance()
        with pytest.raises(FirecrackerUnreachableError):
            await client.wait_ready(0.2)
