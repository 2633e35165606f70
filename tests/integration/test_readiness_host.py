"""The real Firecracker readiness probe on this machine, checked against facts gathered here independently.

Nothing is assumed about the host: each test reads the same ground truth the probe should (PATH, /dev/kvm,
/proc/cpuinfo, /proc/modules and /sys/module) by its own means and asserts the probe agrees. On the CI machines
(PVM KVM, no vmx/svm, no firecracker binary) that means "not usable" with all three named.
"""

from __future__ import annotations

import fcntl
import os
import platform
import shutil
import time
from pathlib import Path

import pytest

from corral.errors import ProviderUnavailableError
from corral.microvm import Readiness, ReadinessConfig, probe
from corral.providers.base import WorkspaceSpec
from corral.providers.firecracker import FirecrackerProvider

pytestmark = pytest.mark.integration

KVM = "/dev/kvm"


def _config() -> ReadinessConfig:
    return ReadinessConfig(
        firecracker_bin=os.environ.get("CORRAL_FIRECRACKER_BIN", "firecracker"),
        kernel_path=os.environ.get("CORRAL_FIRECRACKER_KERNEL") or None,
        rootfs_path=os.environ.get("CORRAL_FIRECRACKER_ROOTFS") or None,
    )


@pytest.fixture(scope="module")
def readiness() -> Readiness:
    return probe(_config())


def _module_loaded(name: str) -> bool:
    modules = Path("/proc/modules")
    listed = modules.exists() and any(line.split()[:1] == [name] for line in modules.read_text().splitlines())
    return listed or Path("/sys/module", name).is_dir()


def _cpu_flags() -> set[str]:
    flags: set[str] = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags.update(line.partition(":")[2].split())
    return flags


def test_probe_is_fast_and_complete() -> None:
    """The real probe answers within a couple of seconds with every named check."""
    started = time.monotonic()
    result = probe(_config())

    assert time.monotonic() - started < 6.0
    assert {c.name for c in result.checks} == {
        "kvm_device",
        "kvm_api_version",
        "kvm_create_vm",
        "pvm",
        "hardware_virtualization",
        "kvm_extensions",
        "firecracker_binary",
        "guest_kernel",
        "guest_rootfs",
    }


def test_usable_only_when_every_check_passes(readiness: Readiness) -> None:
    """usable is exactly "no check failed", and a refusal starts with "KVM not available: " naming each failure."""
    assert readiness.usable == all(c.ok for c in readiness.checks)
    if not readiness.usable:
        assert readiness.reason.startswith("KVM not available: ")
        for check in readiness.checks:
            if not check.ok and not check.skipped:
                assert check.detail in readiness.reason, check.name


def test_binary_check_matches_path_lookup(readiness: Readiness) -> None:
    """The binary check fails, and the reason says so, exactly when no firecracker can be found."""
    found = shutil.which(_config().firecracker_bin)
    check = readiness.check("firecracker_binary")

    if found is None:
        assert not check.ok
        assert "firecracker binary" in readiness.reason
        assert not readiness.usable
    elif check.ok:  # found and `--version` worked
        assert check.detail.startswith(found)
    else:  # found but `--version` failed
        assert found in check.detail


def test_kvm_device_checks_match_the_device(readiness: Readiness) -> None:
    """kvm_device and the API version agree with opening /dev/kvm and asking it directly."""
    try:
        fd = os.open(KVM, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        assert not readiness.check("kvm_device").ok
        assert KVM in readiness.reason
        assert readiness.check("kvm_api_version").skipped
        return
    try:
        version = fcntl.ioctl(fd, 0xAE00, 0)
    finally:
        os.close(fd)
    assert readiness.check("kvm_device").ok
    assert readiness.check("kvm_api_version").ok == (version == 12)


def test_pvm_check_matches_loaded_modules(readiness: Readiness) -> None:
    """The pvm check fails, and the reason mentions PVM, exactly when the kvm_pvm module is loaded."""
    pvm = _module_loaded("kvm_pvm")

    assert readiness.check("pvm").ok is not pvm
    if pvm:
        assert "PVM" in readiness.reason
        assert not readiness.usable


@pytest.mark.skipif(platform.machine() != "x86_64", reason="vmx/svm are x86 CPU flags")
def test_hardware_check_matches_cpu_flags(readiness: Readiness) -> None:
    """The hardware virtualization check passes exactly when the CPU lists vmx or svm; a nested guest is noted."""
    flags = _cpu_flags()
    check = readiness.check("hardware_virtualization")

    assert check.ok == bool(flags & {"vmx", "svm"})
    if not check.ok:
        assert "no vmx or svm flag" in readiness.reason
    if "hypervisor" in flags:
        assert "virtual machine" in check.detail


def test_guest_images_match_configuration(readiness: Readiness) -> None:
    """Unset guest image variables fail their checks with the variable to set."""
    config = _config()

    if config.kernel_path is None:
        assert "set CORRAL_FIRECRACKER_KERNEL" in readiness.reason
    else:
        assert readiness.check("guest_kernel").ok == Path(config.kernel_path).is_file()
    if config.rootfs_path is None:
        assert "set CORRAL_FIRECRACKER_ROOTFS" in readiness.reason
    else:
        assert readiness.check("guest_rootfs").ok == Path(config.rootfs_path).is_file()


async def test_provider_on_this_host() -> None:
    """The provider's health mirrors the real probe, and create refuses (with the probe's reason when unusable)."""
    provider = FirecrackerProvider(_config())

    health = await provider.health()
    readiness = await provider.readiness()

    assert health.healthy == readiness.usable
    with pytest.raises(ProviderUnavailableError) as caught:
        await provider.create(WorkspaceSpec(id="ws-readiness", image="corral/workspace:base"))
    if not readiness.usable:
        assert health.error == readiness.reason
        assert str(caught.value).startswith("firecracker: KVM not available: ")
