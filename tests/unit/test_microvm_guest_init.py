"""The VM init's command-line parsing and its refusal to act outside a VM."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from corral.microvm import guest_init
from corral.microvm.guest_init import IpConfig, parse_cmdline, parse_ip_arg

pytestmark = pytest.mark.unit


def test_parse_cmdline() -> None:
    """key=value words become a dict; bare words map to ""; later words win."""
    args = parse_cmdline(
        "console=ttyS0 reboot=k pci=off quiet ip=1.2.3.4::1.2.3.1:255.255.255.252::eth0:off ro x=1 x=2"
    )
    assert args["console"] == "ttyS0"
    assert args["quiet"] == ""
    assert args["ip"] == "1.2.3.4::1.2.3.1:255.255.255.252::eth0:off"
    assert args["x"] == "2"


def test_parse_ip_arg_static() -> None:
    """The static ip= form gives address, gateway, mask, hostname, device and DNS servers."""
    config = parse_ip_arg("172.31.0.2::172.31.0.1:255.255.255.252:workspace:eth0:off:1.1.1.1:9.9.9.9")
    assert config == IpConfig(
        address="172.31.0.2",
        gateway="172.31.0.1",
        netmask="255.255.255.252",
        hostname="workspace",
        device="eth0",
        dns=("1.1.1.1", "9.9.9.9"),
    )
    assert config.prefixlen == 30


def test_parse_ip_arg_minimal_and_absent() -> None:
    """Device defaults to eth0; dhcp, off and empty values configure nothing."""
    config = parse_ip_arg("10.0.0.5:::255.0.0.0")
    assert config is not None
    assert (config.device, config.gateway, config.hostname, config.dns, config.prefixlen) == ("eth0", None, None, (), 8)
    assert parse_ip_arg("dhcp") is None
    assert parse_ip_arg("off") is None
    assert parse_ip_arg("") is None


def test_parse_ip_arg_rejects_malformed_addresses() -> None:
    """A malformed address raises OSError (init logs it and leaves the network alone)."""
    with pytest.raises(OSError, match="illegal IP address"):
        parse_ip_arg("10.0.0.999::10.0.0.1:255.255.255.0::eth0:off")


def test_init_refuses_to_run_outside_a_vm() -> None:
    """Run on a host (not PID 1, not emulated) the init exits with status 2 without touching anything."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    done = subprocess.run(
        [sys.executable, guest_init.__file__], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 2
    assert "refusing to run: not PID 1" in done.stderr
