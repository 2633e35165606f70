"""Can Firecracker microVMs run on this host? A probe that tells the truth, not just "``/dev/kvm`` exists".

:func:`probe` runs every check below and combines the failures into one sentence, most fundamental first:

==========================  =====================================================================================
``kvm_device``              ``/dev/kvm`` exists and opens read-write
``kvm_api_version``         ``KVM_GET_API_VERSION`` answers 12 (Firecracker refuses anything else)
``kvm_create_vm``           ``KVM_CREATE_VM`` hands back a VM file descriptor
``pvm``                     KVM is not PVM (``kvm_pvm``): a paravirtualised KVM that stock guest kernels hang on
``hardware_virtualization`` the CPU has vmx (Intel VT-x) or svm (AMD-V); notes a nested guest (``hypervisor`` flag)
``kvm_extensions``          every KVM capability Firecracker checks for at start-up is present
``firecracker_binary``      the binary is on PATH (or at the configured path), executable, and ``--version`` works
``guest_kernel``            the configured guest kernel image exists and is readable
``guest_rootfs``            the configured guest root filesystem image exists and is readable
==========================  =====================================================================================

A check that cannot run because one it depends on failed (no ``/dev/kvm`` to ask for the API version) is reported
with ``ok=False, skipped=True`` and left out of the reason: its cause is already there.

Every read of the host goes through a seam of :func:`probe` (the ``/proc`` and ``/sys`` paths, the PATH lookup,
the command runner, ``open``/``ioctl``/``close``), so tests can simulate good and bad hosts without root.
"""

from __future__ import annotations

import errno
import fcntl
import os
import platform
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = [
    "KVM_API_VERSION",
    "KVM_CHECK_EXTENSION",
    "KVM_CREATE_VM",
    "KVM_GET_API_VERSION",
    "NOT_AVAILABLE_PREFIX",
    "REQUIRED_EXTENSIONS",
    "Check",
    "Readiness",
    "ReadinessConfig",
    "probe",
]

KVM_GET_API_VERSION = 0xAE00
KVM_CREATE_VM = 0xAE01
KVM_CHECK_EXTENSION = 0xAE03
KVM_API_VERSION = 12
"""The only KVM API version Firecracker (and every other VMM) accepts."""

NOT_AVAILABLE_PREFIX = "KVM not available: "
"""How every "not usable" reason begins; callers key on it."""

REQUIRED_EXTENSIONS: dict[str, tuple[tuple[str, int], ...]] = {
    # The capabilities Firecracker checks at start-up (vmm/src/vstate/kvm.rs), numbers from <linux/kvm.h>.
    "x86_64": (
        ("KVM_CAP_IRQCHIP", 0),
        ("KVM_CAP_USER_MEMORY", 3),
        ("KVM_CAP_SET_TSS_ADDR", 4),
        ("KVM_CAP_EXT_CPUID", 7),
        ("KVM_CAP_MP_STATE", 14),
        ("KVM_CAP_IRQFD", 32),
        ("KVM_CAP_PIT2", 33),
        ("KVM_CAP_PIT_STATE2", 35),
        ("KVM_CAP_IOEVENTFD", 36),
        ("KVM_CAP_ADJUST_CLOCK", 39),
        ("KVM_CAP_VCPU_EVENTS", 41),
        ("KVM_CAP_DEBUGREGS", 50),
        ("KVM_CAP_XSAVE", 55),
        ("KVM_CAP_XCRS", 56),
    ),
    "aarch64": (
        ("KVM_CAP_IRQCHIP", 0),
        ("KVM_CAP_USER_MEMORY", 3),
        ("KVM_CAP_IRQFD", 32),
        ("KVM_CAP_IOEVENTFD", 36),
    ),
}

VERSION_TIMEOUT_S = 5.0

Ioctl = Callable[[int, int, int], int]
Runner = Callable[[Sequence[str], float], tuple[int, str]]


@dataclass(frozen=True, slots=True)
class ReadinessConfig:
    """What to probe: the Firecracker binary, the KVM device, and the guest kernel and root filesystem images."""

    firecracker_bin: str = "firecracker"
    """A name looked up on PATH, or a path (anything holding a ``/``) used as it is."""
    kvm_device: str = "/dev/kvm"
    kernel_path: str | None = None
    rootfs_path: str | None = None


@dataclass(frozen=True, slots=True)
class Check:
    """One probe step. ``detail`` says what was found when ``ok``, and is the reason's clause when not."""

    name: str
    ok: bool
    detail: str
    skipped: bool = False
    """True when the check could not run because a check it depends on failed (then ``ok`` is False)."""


@dataclass(frozen=True, slots=True)
class Readiness:
    """The probe's verdict: usable only when every check passed; ``reason`` is one sentence either way."""

    usable: bool
    reason: str
    checks: tuple[Check, ...]

    def check(self, name: str) -> Check:
        """The check called ``name``; raises KeyError for an unknown one."""
        for item in self.checks:
            if item.name == name:
                return item
        raise KeyError(name)

    @property
    def failed(self) -> tuple[Check, ...]:
        """The checks that did not pass, skipped ones included, in probe order."""
        return tuple(c for c in self.checks if not c.ok)


# --- default seams --------------------------------------------------------------------------------------------------


def _open_device(path: str) -> int:
    return os.open(path, os.O_RDWR | os.O_CLOEXEC)


def _ioctl(fd: int, request: int, arg: int) -> int:
    return fcntl.ioctl(fd, request, arg)


def _run(argv: Sequence[str], timeout_s: float) -> tuple[int, str]:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, check=False)
    return done.returncode, (done.stdout or "") + (done.stderr or "")


def _os_error_text(exc: OSError) -> str:
    """``"Permission denied (EACCES)"``: the errno's message and its symbolic name."""
    if exc.errno is None:
        return str(exc)
    name = errno.errorcode.get(exc.errno, str(exc.errno))
    return f"{os.strerror(exc.errno)} ({name})"


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


# --- the checks -----------------------------------------------------------------------------------------------------


def _skipped(name: str, because: str) -> Check:
    return Check(name, ok=False, detail=f"not checked: {because}", skipped=True)


def _kvm_checks(
    device: str, machine: str, open_device: Callable[[str], int], ioctl: Ioctl, close: Callable[[int], None]
) -> tuple[Check, Check, Check, Check]:
    """``kvm_device``, ``kvm_api_version``, ``kvm_create_vm`` and ``kvm_extensions``, on one open descriptor."""
    try:
        fd = open_device(device)
    except FileNotFoundError:
        opened = Check(
            "kvm_device",
            ok=False,
            detail=f"{device} does not exist (KVM is not loaded, or the device was not passed in)",
        )
    except OSError as exc:
        opened = Check("kvm_device", ok=False, detail=f"{device} cannot be opened read-write: {_os_error_text(exc)}")
    else:
        try:
            api, create, extensions = _kvm_ioctl_checks(device, fd, machine, ioctl, close)
            return Check("kvm_device", ok=True, detail=f"{device} opened read-write"), api, create, extensions
        finally:
            close(fd)
    because = f"{device} could not be opened"
    return (
        opened,
        _skipped("kvm_api_version", because),
        _skipped("kvm_create_vm", because),
        _skipped("kvm_extensions", because),
    )


def _kvm_ioctl_checks(
    device: str, fd: int, machine: str, ioctl: Ioctl, close: Callable[[int], None]
) -> tuple[Check, Check, Check]:
    """``kvm_api_version``, ``kvm_create_vm`` and ``kvm_extensions`` on the open ``/dev/kvm`` descriptor."""
    try:
        version = ioctl(fd, KVM_GET_API_VERSION, 0)
    except OSError as exc:
        api = Check(
            "kvm_api_version", ok=False, detail=f"KVM_GET_API_VERSION on {device} failed: {_os_error_text(exc)}"
        )
    else:
        api = Check(
            "kvm_api_version",
            ok=version == KVM_API_VERSION,
            detail=f"KVM API version {version}"
            if version == KVM_API_VERSION
            else f"KVM_GET_API_VERSION on {device} returned {version}, not {KVM_API_VERSION}",
        )
    if not api.ok:
        because = f"the KVM API version is not {KVM_API_VERSION}"
        return api, _skipped("kvm_create_vm", because), _skipped("kvm_extensions", because)

    try:
        vm_fd = ioctl(fd, KVM_CREATE_VM, 0)
    except OSError as exc:
        create = Check("kvm_create_vm", ok=False, detail=f"KVM_CREATE_VM on {device} failed: {_os_error_text(exc)}")
    else:
        close(vm_fd)
        create = Check("kvm_create_vm", ok=True, detail="KVM_CREATE_VM returned a VM file descriptor")

    required = REQUIRED_EXTENSIONS.get(machine, REQUIRED_EXTENSIONS["x86_64"])
    missing: list[str] = []
    for cap_name, cap in required:
        try:
            present = ioctl(fd, KVM_CHECK_EXTENSION, cap) > 0
        except OSError:
            present = False
        if not present:
            missing.append(cap_name)
    if missing:
        extensions = Check(
            "kvm_extensions",
            ok=False,
            detail=f"{device} lacks {', '.join(missing)}, which Firecracker needs",
        )
    else:
        extensions = Check(
            "kvm_extensions", ok=True, detail=f"all {len(required)} KVM capabilities Firecracker needs are present"
        )
    return api, create, extensions


def _loaded_modules(modules_path: str, sys_module_dir: str, names: Sequence[str]) -> set[str]:
    """Which of ``names`` are loaded: listed in ``/proc/modules`` or present under ``/sys/module`` (built-ins)."""
    found: set[str] = set()
    listing = _read_text(modules_path)
    if listing is not None:
        listed = {line.split(maxsplit=1)[0] for line in listing.splitlines() if line.strip()}
        found.update(n for n in names if n in listed)
    found.update(n for n in names if os.path.isdir(os.path.join(sys_module_dir, n)))
    return found


def _pvm_check(modules_path: str, sys_module_dir: str) -> Check:
    loaded = _loaded_modules(modules_path, sys_module_dir, ("kvm_pvm", "kvm_intel", "kvm_amd"))
    if "kvm_pvm" in loaded:
        return Check(
            "pvm",
            ok=False,
            detail="/dev/kvm is backed by PVM (kvm_pvm module), a paravirtualised KVM that Firecracker's stock "
            "guest kernels cannot boot on",
        )
    vendor = sorted(loaded & {"kvm_intel", "kvm_amd"})
    backing = f"KVM is backed by {' and '.join(vendor)}" if vendor else "no KVM vendor module is visible"
    return Check("pvm", ok=True, detail=f"kvm_pvm is not loaded; {backing}")


def _cpu_flags(cpuinfo: str) -> set[str]:
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in {"flags", "Features"}:
            flags.update(value.split())
    return flags


def _hardware_check(cpuinfo_path: str, machine: str) -> Check:
    name = "hardware_virtualization"
    if machine not in {"x86_64", "AMD64", "i686", "i386"}:
        return Check(name, ok=True, detail=f"{machine}: no CPU flag to check; KVM's answers above decide")
    cpuinfo = _read_text(cpuinfo_path)
    if cpuinfo is None:
        return Check(name, ok=False, detail=f"{cpuinfo_path} cannot be read, so hardware virtualization is unknown")
    flags = _cpu_flags(cpuinfo)
    nested = "hypervisor" in flags
    if "vmx" in flags or "svm" in flags:
        kind = "vmx (Intel VT-x)" if "vmx" in flags else "svm (AMD-V)"
        extra = "; this host is itself a virtual machine (hypervisor flag), so VMs run nested" if nested else ""
        return Check(name, ok=True, detail=f"the CPU has {kind}{extra}")
    why = (
        ", because this host is itself a virtual machine (hypervisor flag) that exposes no nested virtualization"
        if nested
        else ", so hardware virtualization is absent or disabled in the firmware"
    )
    return Check(name, ok=False, detail=f"the CPU has no vmx or svm flag{why}")


def _binary_missing(name: str) -> str:
    """Why ``which`` found nothing: not on PATH, no such path, or a path that is not an executable file."""
    if os.sep not in name:
        where = "not on PATH" if name == "firecracker" else f"{name!r} is not on PATH"
        return f"the firecracker binary is not installed ({where})"
    if not os.path.exists(name):
        return f"the firecracker binary {name} does not exist"
    return f"the firecracker binary {name} is not an executable file"


def _binary_check(name: str, which: Callable[[str], str | None], run: Runner) -> Check:
    check = "firecracker_binary"
    found = which(name)
    if found is None:
        return Check(check, ok=False, detail=_binary_missing(name))
    try:
        code, output = run([found, "--version"], VERSION_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return Check(check, ok=False, detail=f"`{found} --version` did not answer within {VERSION_TIMEOUT_S:g} s")
    except OSError as exc:
        return Check(check, ok=False, detail=f"the firecracker binary {found} cannot run: {_os_error_text(exc)}")
    first = next((line.strip() for line in output.splitlines() if line.strip()), "")
    if code != 0:
        said = f": {first}" if first else ""
        return Check(check, ok=False, detail=f"`{found} --version` exited with status {code}{said}")
    return Check(check, ok=True, detail=f"{found}: {first or 'no version printed'}")


def _file_check(check: str, what: str, path: str | None, env: str) -> Check:
    if path is None:
        return Check(check, ok=False, detail=f"no {what} configured (set {env})")
    if not os.path.exists(path):
        return Check(check, ok=False, detail=f"the {what} {path} does not exist")
    if not os.path.isfile(path):
        return Check(check, ok=False, detail=f"the {what} {path} is not a regular file")
    if not os.access(path, os.R_OK):
        return Check(check, ok=False, detail=f"the {what} {path} is not readable")
    return Check(check, ok=True, detail=f"{path} ({os.path.getsize(path)} bytes)")


def _join(clauses: Sequence[str]) -> str:
    if len(clauses) <= 1:
        return "".join(clauses)
    return "; ".join(clauses[:-1]) + "; and " + clauses[-1]


# --- the probe ------------------------------------------------------------------------------------------------------


def probe(
    config: ReadinessConfig,
    *,
    which: Callable[[str], str | None] = shutil.which,
    run: Runner = _run,
    open_device: Callable[[str], int] = _open_device,
    ioctl: Ioctl = _ioctl,
    close: Callable[[int], None] = os.close,
    cpuinfo_path: str = "/proc/cpuinfo",
    modules_path: str = "/proc/modules",
    sys_module_dir: str = "/sys/module",
    machine: str | None = None,
) -> Readiness:
    """Run every check against this host (or the simulated one the seams describe) and give the verdict.

    Never raises for a host problem: each one becomes a failed :class:`Check` and a clause of ``reason``.
    """
    arch = machine or platform.machine()
    device, api, create, extensions = _kvm_checks(config.kvm_device, arch, open_device, ioctl, close)
    checks = (
        device,
        api,
        create,
        _pvm_check(modules_path, sys_module_dir),
        _hardware_check(cpuinfo_path, arch),
        extensions,
        _binary_check(config.firecracker_bin, which, run),
        _file_check("guest_kernel", "guest kernel", config.kernel_path, "CORRAL_FIRECRACKER_KERNEL"),
        _file_check("guest_rootfs", "guest rootfs", config.rootfs_path, "CORRAL_FIRECRACKER_ROOTFS"),
    )
    failed = [c.detail for c in checks if not c.ok and not c.skipped]
    if failed:
        return Readiness(usable=False, reason=NOT_AVAILABLE_PREFIX + _join(failed), checks=checks)
    version = checks[6].detail
    return Readiness(
        usable=True,
        reason=f"Firecracker microVMs can run: {config.kvm_device} is hardware-backed KVM (API {KVM_API_VERSION}) "
        f"with every capability Firecracker needs, and {version}",
        checks=checks,
    )
