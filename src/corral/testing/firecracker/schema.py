"""What Firecracker's API accepts, as the double checks it: the body definitions of ``firecracker.yaml`` at the
version the double claims (:data:`VMM_VERSION`), validated the way serde with ``deny_unknown_fields`` does, the
prefixes Firecracker puts on its fault messages, and :class:`ApiFault`, the refusal every part of the double raises.

The version is 1.12.0: the first release whose ``PUT /snapshot/load`` takes ``network_overrides`` (restoring a
snapshot onto another TAP device, which the manager needs to restore one VM's snapshot into another). Fields added
later are unknown fields here and refused as Firecracker 1.12 refuses them: ``mtu`` on network interfaces (1.16),
``track_dirty_pages`` on snapshot load (1.13), ``vsock_override`` and ``clock_realtime`` on snapshot load (after
1.15), and ``huge_pages: "Transparent"`` (only ``None`` and ``2M`` are listed for 1.12).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BOOT_SOURCE",
    "CREATE_SNAPSHOT",
    "DESERIALIZE",
    "DRIVE",
    "INTERNAL",
    "LOAD_SNAPSHOT",
    "LOGGER",
    "MACHINE",
    "METRICS",
    "NETWORK",
    "SCHEMAS",
    "START",
    "VMM_VERSION",
    "VSOCK",
    "ApiFault",
    "Schema",
    "validate",
    "variant",
]

VMM_VERSION = "1.12.0"
"""The Firecracker release whose API the double enforces (``GET /version`` adds ``-corral-double``)."""

DESERIALIZE = "An error occurred when deserializing the json body of a request: "
# Firecracker's ``VmmActionError`` wraps each component's error in a prefix (``rpc_interface.rs``); the API server
# answers ``{"fault_message": "<prefix><inner error>"}`` with status 400.
BOOT_SOURCE = "Boot source error: "
CREATE_SNAPSHOT = "Create snapshot error: "
DRIVE = "Drive config error: "
INTERNAL = "Internal VMM error: "
LOAD_SNAPSHOT = "Load snapshot error: "
LOGGER = "Logger error: "
MACHINE = "Machine config error: "
METRICS = "Metrics error: "
NETWORK = "Network config error: "
START = "Start microvm error: "
VSOCK = "Vsock config error: "

# name -> field -> (python type, required)
Schema = dict[str, tuple[type, bool]]
SCHEMAS: dict[str, Schema] = {
    "MachineConfiguration": {
        "vcpu_count": (int, True),
        "mem_size_mib": (int, True),
        "smt": (bool, False),
        "track_dirty_pages": (bool, False),
        "cpu_template": (str, False),
        "huge_pages": (str, False),
    },
    "BootSource": {"kernel_image_path": (str, True), "boot_args": (str, False), "initrd_path": (str, False)},
    "Drive": {
        "drive_id": (str, True),
        "is_root_device": (bool, True),
        "path_on_host": (str, False),
        "is_read_only": (bool, False),
        "partuuid": (str, False),
        "cache_type": (str, False),
        "io_engine": (str, False),
        "rate_limiter": (dict, False),
        "socket": (str, False),
    },
    "PartialDrive": {"drive_id": (str, True), "path_on_host": (str, False), "rate_limiter": (dict, False)},
    "NetworkInterface": {
        "iface_id": (str, True),
        "host_dev_name": (str, True),
        "guest_mac": (str, False),
        "rx_rate_limiter": (dict, False),
        "tx_rate_limiter": (dict, False),
    },
    "PartialNetworkInterface": {
        "iface_id": (str, True),
        "rx_rate_limiter": (dict, False),
        "tx_rate_limiter": (dict, False),
    },
    "Vsock": {"guest_cid": (int, True), "uds_path": (str, True), "vsock_id": (str, False)},
    "InstanceActionInfo": {"action_type": (str, True)},
    "Vm": {"state": (str, True)},
    "Logger": {
        "level": (str, False),
        "log_path": (str, False),
        "show_level": (bool, False),
        "show_log_origin": (bool, False),
        "module": (str, False),
    },
    "Metrics": {"metrics_path": (str, True)},
    "SnapshotCreateParams": {"mem_file_path": (str, True), "snapshot_path": (str, True), "snapshot_type": (str, False)},
    "SnapshotLoadParams": {
        "snapshot_path": (str, True),
        "mem_file_path": (str, False),
        "mem_backend": (dict, False),
        "enable_diff_snapshots": (bool, False),
        "resume_vm": (bool, False),
        "network_overrides": (list, False),
    },
    "MemoryBackend": {"backend_type": (str, True), "backend_path": (str, True)},
    "NetworkOverride": {"iface_id": (str, True), "host_dev_name": (str, True)},
}


class ApiFault(Exception):
    """A request Firecracker would refuse: status and ``fault_message``."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def _type_name(value: object) -> str:
    if isinstance(value, bool):
        return f"boolean `{str(value).lower()}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, str):
        return f'string "{value}"'
    if value is None:
        return "null"
    return "map" if isinstance(value, dict) else "sequence"


def validate(schema_name: str, body: object) -> dict[str, Any]:
    """Check a body against one of Firecracker's definitions, the way serde with ``deny_unknown_fields`` does."""
    prefix = DESERIALIZE
    if not isinstance(body, dict):
        raise ApiFault(f"{prefix}invalid type: {_type_name(body)}, expected struct {schema_name}")
    schema = SCHEMAS[schema_name]
    for key in body:
        if key not in schema:
            expected = ", ".join(f"`{k}`" for k in schema)
            raise ApiFault(f"{prefix}unknown field `{key}`, expected one of {expected}")
    for key, (kind, required) in schema.items():
        if key not in body:
            if required:
                raise ApiFault(f"{prefix}missing field `{key}`")
            continue
        value = body[key]
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if kind is int and ok and value < 0:
            ok = False
        if not ok:
            wanted = {int: "u64", bool: "a boolean", str: "a string", dict: "struct", list: "a sequence"}[kind]
            raise ApiFault(f"{prefix}invalid type: {_type_name(value)}, expected {wanted}")
    return body


def variant(value: str, allowed: tuple[str, ...]) -> str:
    """An enum field's value, or serde's ``unknown variant`` refusal."""
    if value not in allowed:
        names = ", ".join(f"`{a}`" for a in allowed)
        raise ApiFault(f"{DESERIALIZE}unknown variant `{value}`, expected one of {names}")
    return value
