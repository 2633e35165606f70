"""What Firecracker's API accepts, as the double checks it: the body definitions of ``firecracker.yaml``, validated
the way serde with ``deny_unknown_fields`` does, and :class:`ApiFault`, the refusal every part of the double raises.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DESERIALIZE", "SCHEMAS", "ApiFault", "Schema", "validate"]

DESERIALIZE = "An error occurred when deserializing the json body of a request: "

# name -> (python type, required)
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
        "mtu": (int, False),
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
            wanted = {int: "u64", bool: "a boolean", str: "a string", dict: "struct"}[kind]
            raise ApiFault(f"{prefix}invalid type: {_type_name(value)}, expected {wanted}")
    return body
