"""The Firecracker readiness probe on simulated hosts, and the honest FirecrackerProvider stub built on it."""

from __future__ import annotations

import errno
import stat
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from corral.errors import ProviderUnavailableError, WorkspaceNotFoundError
from corral.microvm import Check, Readiness, ReadinessConfig, probe
from corral.microvm.readiness import (
    KVM_CHECK_EXTENSION,
    KVM_CREATE_VM,
    KVM_GET_API_VERSION,
    NOT_AVAILABLE_PREFIX,
    REQUIRED_EXTENSIONS,
)
from corral.providers.base import ExecRequest, WorkspaceProvider, WorkspaceSpec, WorkspaceState
from corral.providers.firecracker import READINESS_CACHE_S, FirecrackerProvider, from_settings
from corral.settings import Settings

pytestmark = pytest.mark.unit

CHECK_NAMES = (
    "kvm_device",
    "kvm_api_version",
    "kvm_create_vm",
    "pvm",
    "hardware_virtualization",
    "kvm_extensions",
    "firecracker_binary",
    "guest_kernel",
    "guest_rootfs",
)
KVM_FD = 7
VM_FD = 8


@dataclass
class FakeKvm:
    """A scriptable /dev/kvm: open, the three ioctls the probe issues, and close, with every fd recorded."""

    open_error: OSError | None = None
    api_version: int = 12
    api_error: OSError | None = None
    create_error: OSError | None = None
    missing_caps: frozenset[int] = frozenset()
    opened: list[str] = field(default_factory=list)
    closed: list[int] = field(default_factory=list)

    def open(self, path: str) -> int:
        if self.open_error is not None:
            raise self.open_error
        self.opened.append(path)
        return KVM_FD

    def ioctl(self, fd: int, request: int, arg: int) -> int:
        assert fd == KVM_FD
        if request == KVM_GET_API_VERSION:
            if self.api_error is not None:
                raise self.api_error
            return self.api_version
        if request == KVM_CREATE_VM:
            if self.create_error is not None:
                raise self.create_error
            return VM_FD
        if request == KVM_CHECK_EXTENSION:
            return 0 if arg in self.missing_caps else 1
        raise AssertionError(f"unexpected ioctl {request:#x}")

    def close(self, fd: int) -> None:
        self.closed.append(fd)


@dataclass
class FakeHost:
    """Everything the probe reads, pointed at files under tmp_path; starts out as a fully good x86 host."""

    root: Path
    kvm: FakeKvm = field(default_factory=FakeKvm)
    cpu_flags: str = "fpu vme de pse tsc msr vmx ept"
    modules: tuple[str, ...] = ("kvm_intel", "kvm")
    sys_modules: tuple[str, ...] = ("kvm", "kvm_intel")
    binary: str | None = "/usr/local/bin/firecracker"
    version_result: tuple[int, str] | BaseException = (0, "Firecracker v1.7.0\n\nSupported snapshot versions: 1.0\n")
    machine: str = "x86_64"
    runs: list[list[str]] = field(default_factory=list)

    def config(self, **changes: Any) -> ReadinessConfig:
        kernel = self.root / "vmlinux"
        rootfs = self.root / "rootfs.ext4"
        kernel.write_bytes(b"\x7fELF kernel")
        rootfs.write_bytes(b"\0" * 1024)
        return replace(ReadinessConfig(kernel_path=str(kernel), rootfs_path=str(rootfs)), **changes)

    def which(self, name: str) -> str | None:
        return self.binary if name == "firecracker" else None

    def run(self, argv: Sequence[str], timeout_s: float) -> tuple[int, str]:
        assert timeout_s == 5.0
        self.runs.append(list(argv))
        if isinstance(self.version_result, BaseException):
            raise self.version_result
        return self.version_result

    def probe(self, config: ReadinessConfig | None = None) -> Readiness:
        proc = self.root / "proc"
        proc.mkdir(exist_ok=True)
        (proc / "cpuinfo").write_text(f"processor\t: 0\nflags\t\t: {self.cpu_flags}\n\nprocessor\t: 1\n")
        (proc / "modules").write_text("".join(f"{m} 1234 0 - Live 0x0\n" for m in self.modules))
        sys_module = self.root / "sys_module"
        sys_module.mkdir(exist_ok=True)
        for name in self.sys_modules:
            (sys_module / name).mkdir(exist_ok=True)
        return probe(
            config or self.config(),
            which=self.which,
            run=self.run,
            open_device=self.kvm.open,
            ioctl=self.kvm.ioctl,
            close=self.kvm.close,
            cpuinfo_path=str(proc / "cpuinfo"),
            modules_path=str(proc / "modules"),
            sys_module_dir=str(sys_module),
            machine=self.machine,
        )


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    return FakeHost(tmp_path)


def failing(readiness: Readiness) -> list[str]:
    return [c.name for c in readiness.checks if not c.ok and not c.skipped]


def assert_reason_names_failures(readiness: Readiness) -> None:
    assert not readiness.usable
    assert readiness.reason.startswith(NOT_AVAILABLE_PREFIX)
    for check in readiness.checks:
        if not check.ok and not check.skipped:
            assert check.detail in readiness.reason, check.name
        if check.skipped:
            assert check.detail not in readiness.reason


# --- the probe ----------------------------------------------------------------------------------------------------


def test_good_host_is_usable(host: FakeHost) -> None:
    """A hardware-backed KVM with every capability, a working binary and both guest images makes the host usable."""
    readiness = host.probe()

    assert readiness.usable
    assert [c.name for c in readiness.checks] == list(CHECK_NAMES)
    assert all(c.ok and not c.skipped for c in readiness.checks)
    assert readiness.reason.startswith("Firecracker microVMs can run")
    assert "Firecracker v1.7.0" in readiness.check("firecracker_binary").detail
    assert "kvm_intel" in readiness.check("pvm").detail
    assert host.runs == [["/usr/local/bin/firecracker", "--version"]]
    assert host.kvm.opened == ["/dev/kvm"]
    assert sorted(host.kvm.closed) == [KVM_FD, VM_FD]


def test_no_binary_on_path(host: FakeHost) -> None:
    """Without a firecracker on PATH only the binary check fails, and the reason says exactly that."""
    host.binary = None

    readiness = host.probe()

    assert failing(readiness) == ["firecracker_binary"]
    assert readiness.reason == "KVM not available: the firecracker binary is not installed (not on PATH)"
    assert host.runs == []


def test_dev_kvm_missing(host: FakeHost) -> None:
    """A missing /dev/kvm fails kvm_device and skips the ioctl checks, which stay out of the reason."""
    host.kvm.open_error = FileNotFoundError(errno.ENOENT, "No such file or directory")

    readiness = host.probe()

    assert failing(readiness) == ["kvm_device"]
    assert [c.name for c in readiness.checks if c.skipped] == ["kvm_api_version", "kvm_create_vm", "kvm_extensions"]
    assert readiness.reason.startswith("KVM not available: /dev/kvm does not exist")
    assert "API version" not in readiness.reason
    assert_reason_names_failures(readiness)


def test_dev_kvm_permission_denied(host: FakeHost) -> None:
    """An unopenable /dev/kvm is reported with the errno text."""
    host.kvm.open_error = PermissionError(errno.EACCES, "Permission denied")

    readiness = host.probe()

    assert failing(readiness) == ["kvm_device"]
    assert "/dev/kvm cannot be opened read-write: Permission denied (EACCES)" in readiness.reason
    assert_reason_names_failures(readiness)


def test_wrong_api_version(host: FakeHost) -> None:
    """An API version other than 12 fails and stops the VM and capability checks, whose ABI would be unknown."""
    host.kvm.api_version = 11

    readiness = host.probe()

    assert failing(readiness) == ["kvm_api_version"]
    assert readiness.check("kvm_create_vm").skipped
    assert "KVM_GET_API_VERSION on /dev/kvm returned 11, not 12" in readiness.reason
    assert host.kvm.closed == [KVM_FD]
    assert_reason_names_failures(readiness)


def test_api_version_ioctl_error(host: FakeHost) -> None:
    """An ioctl that fails outright is reported with its errno text."""
    host.kvm.api_error = OSError(errno.ENOTTY, "Inappropriate ioctl for device")

    readiness = host.probe()

    assert failing(readiness) == ["kvm_api_version"]
    assert "KVM_GET_API_VERSION on /dev/kvm failed: Inappropriate ioctl for device (ENOTTY)" in readiness.reason


def test_create_vm_fails(host: FakeHost) -> None:
    """KVM_CREATE_VM failing is its own failure; the capability check still runs on the system fd."""
    host.kvm.create_error = OSError(errno.ENOMEM, "Cannot allocate memory")

    readiness = host.probe()

    assert failing(readiness) == ["kvm_create_vm"]
    assert readiness.check("kvm_extensions").ok
    assert "KVM_CREATE_VM on /dev/kvm failed: Cannot allocate memory (ENOMEM)" in readiness.reason
    assert host.kvm.closed == [KVM_FD]


def test_missing_extensions_are_named(host: FakeHost) -> None:
    """Each capability KVM lacks is named in the reason."""
    host.kvm.missing_caps = frozenset({32, 36})

    readiness = host.probe()

    assert failing(readiness) == ["kvm_extensions"]
    assert "/dev/kvm lacks KVM_CAP_IRQFD, KVM_CAP_IOEVENTFD, which Firecracker needs" in readiness.reason


def test_extension_list_covers_the_briefs_minimum() -> None:
    """The x86 capability list includes IRQCHIP, USER_MEMORY, SET_TSS_ADDR, IRQFD and IOEVENTFD with their numbers."""
    caps = dict(REQUIRED_EXTENSIONS["x86_64"])

    assert {caps[n] for n in ("KVM_CAP_IRQCHIP", "KVM_CAP_USER_MEMORY", "KVM_CAP_SET_TSS_ADDR")} == {0, 3, 4}
    assert (caps["KVM_CAP_IRQFD"], caps["KVM_CAP_IOEVENTFD"]) == (32, 36)


@pytest.mark.parametrize("where", ["proc_modules", "sys_module"])
def test_pvm_module_fails(host: FakeHost, where: str) -> None:
    """kvm_pvm, listed in /proc/modules or present under /sys/module, marks KVM as paravirtualised and unusable."""
    if where == "proc_modules":
        host.modules = ("kvm_pvm", "kvm")
        host.sys_modules = ("kvm",)
    else:  # a kernel without /proc/modules content for it (built in), as on the CI machines
        host.modules = ()
        host.sys_modules = ("kvm", "kvm_pvm")

    readiness = host.probe()

    assert failing(readiness) == ["pvm"]
    assert readiness.reason == (
        "KVM not available: /dev/kvm is backed by PVM (kvm_pvm module), a paravirtualised KVM that Firecracker's "
        "stock guest kernels cannot boot on"
    )


def test_missing_proc_modules_is_not_an_error(host: FakeHost, tmp_path: Path) -> None:
    """A host without /proc/modules still passes the pvm check when /sys/module shows no kvm_pvm."""
    host.probe()  # lays out the fake /proc and /sys

    readiness = probe(
        host.config(),
        which=host.which,
        run=host.run,
        open_device=host.kvm.open,
        ioctl=host.kvm.ioctl,
        close=host.kvm.close,
        cpuinfo_path=str(tmp_path / "proc" / "cpuinfo"),
        modules_path=str(tmp_path / "no-such-modules"),
        sys_module_dir=str(tmp_path / "sys_module"),
        machine="x86_64",
    )

    assert readiness.check("pvm").ok
    assert readiness.usable


def test_no_vmx_or_svm_on_a_nested_guest(host: FakeHost) -> None:
    """No vmx/svm with the hypervisor flag says the host is itself a VM without nested virtualization."""
    host.cpu_flags = "fpu vme de pse tsc msr hypervisor"

    readiness = host.probe()

    assert failing(readiness) == ["hardware_virtualization"]
    assert "the CPU has no vmx or svm flag, because this host is itself a virtual machine" in readiness.reason
    assert_reason_names_failures(readiness)


def test_no_vmx_or_svm_on_bare_metal(host: FakeHost) -> None:
    """No vmx/svm and no hypervisor flag points at firmware."""
    host.cpu_flags = "fpu vme de pse tsc msr"

    readiness = host.probe()

    assert failing(readiness) == ["hardware_virtualization"]
    assert "disabled in the firmware" in readiness.reason


def test_svm_on_a_nested_guest_passes_and_says_so(host: FakeHost) -> None:
    """AMD's svm passes; with the hypervisor flag the detail notes the VMs would run nested."""
    host.cpu_flags = "fpu svm hypervisor"

    check = host.probe().check("hardware_virtualization")

    assert check.ok
    assert "svm (AMD-V)" in check.detail and "nested" in check.detail


def test_unreadable_cpuinfo_fails(host: FakeHost, tmp_path: Path) -> None:
    """When /proc/cpuinfo cannot be read the hardware check fails rather than guessing."""
    host.probe()  # lays out the fake /proc and /sys

    readiness = probe(
        host.config(),
        which=host.which,
        run=host.run,
        open_device=host.kvm.open,
        ioctl=host.kvm.ioctl,
        close=host.kvm.close,
        cpuinfo_path=str(tmp_path / "missing-cpuinfo"),
        modules_path=str(tmp_path / "proc" / "modules"),
        sys_module_dir=str(tmp_path / "sys_module"),
        machine="x86_64",
    )

    assert failing(readiness) == ["hardware_virtualization"]
    assert "cannot be read" in readiness.reason


def test_aarch64_has_no_cpu_flag_to_check(host: FakeHost) -> None:
    """On aarch64 there is no vmx/svm flag; the KVM ioctls decide, with the aarch64 capability list."""
    host.machine = "aarch64"
    host.cpu_flags = "fp asimd"
    host.kvm.missing_caps = frozenset({4})  # SET_TSS_ADDR is x86-only

    readiness = host.probe()

    assert readiness.usable


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"kernel_path": None}, ["no guest kernel configured (set CORRAL_FIRECRACKER_KERNEL)"]),
        ({"rootfs_path": None}, ["no guest rootfs configured (set CORRAL_FIRECRACKER_ROOTFS)"]),
        (
            {"kernel_path": None, "rootfs_path": None},
            [
                "no guest kernel configured (set CORRAL_FIRECRACKER_KERNEL)",
                "and no guest rootfs configured (set CORRAL_FIRECRACKER_ROOTFS)",
            ],
        ),
        ({"kernel_path": "/nonexistent/vmlinux"}, ["the guest kernel /nonexistent/vmlinux does not exist"]),
        ({"rootfs_path": "/"}, ["the guest rootfs / is not a regular file"]),
    ],
)
def test_missing_guest_images(host: FakeHost, changes: dict[str, Any], expected: list[str]) -> None:
    """Unset or missing guest kernel and rootfs paths fail with a message naming the variable or the path."""
    readiness = host.probe(host.config(**changes))

    assert readiness.reason == NOT_AVAILABLE_PREFIX + "; ".join(expected)
    assert_reason_names_failures(readiness)


def test_every_failure_is_combined_most_fundamental_first(host: FakeHost) -> None:
    """A PVM nested host without firecracker or images gets one sentence naming all five failures in order."""
    host.modules = ()
    host.sys_modules = ("kvm", "kvm_pvm")
    host.cpu_flags = "fpu hypervisor"
    host.binary = None

    readiness = host.probe(host.config(kernel_path=None, rootfs_path=None))

    assert failing(readiness) == [
        "pvm",
        "hardware_virtualization",
        "firecracker_binary",
        "guest_kernel",
        "guest_rootfs",
    ]
    assert readiness.reason.startswith(
        "KVM not available: /dev/kvm is backed by PVM (kvm_pvm module), a paravirtualised KVM that Firecracker's "
        "stock guest kernels cannot boot on; the CPU has no vmx or svm flag"
    )
    assert readiness.reason.endswith(
        "; the firecracker binary is not installed (not on PATH); no guest kernel configured "
        "(set CORRAL_FIRECRACKER_KERNEL); and no guest rootfs configured (set CORRAL_FIRECRACKER_ROOTFS)"
    )
    assert_reason_names_failures(readiness)


def test_binary_version_failure(host: FakeHost) -> None:
    """A binary whose --version exits nonzero fails with the status and its first line of output."""
    host.version_result = (1, "error: bad things\n")

    readiness = host.probe()

    assert failing(readiness) == ["firecracker_binary"]
    assert "`/usr/local/bin/firecracker --version` exited with status 1: error: bad things" in readiness.reason


def test_binary_version_timeout(host: FakeHost) -> None:
    """A binary that hangs on --version fails after the 5 s timeout."""
    host.version_result = subprocess.TimeoutExpired(["firecracker", "--version"], 5.0)

    readiness = host.probe()

    assert "did not answer within 5 s" in readiness.check("firecracker_binary").detail


def test_binary_that_cannot_run(host: FakeHost) -> None:
    """An exec failure (wrong architecture, broken interpreter) is reported with its errno text."""
    host.version_result = OSError(errno.ENOEXEC, "Exec format error")

    detail = host.probe().check("firecracker_binary").detail

    assert detail == "the firecracker binary /usr/local/bin/firecracker cannot run: Exec format error (ENOEXEC)"


def test_binary_by_path_really_runs(host: FakeHost, tmp_path: Path) -> None:
    """A configured absolute path is run for real (PATH lookup and subprocess seams left at their defaults)."""
    fake_fc = tmp_path / "fc"
    fake_fc.write_text('#!/bin/sh\necho "Firecracker v9.9.9"\n')
    fake_fc.chmod(0o755)
    host.probe()  # lays out the fake /proc and /sys

    readiness = probe(
        host.config(firecracker_bin=str(fake_fc)),
        open_device=host.kvm.open,
        ioctl=host.kvm.ioctl,
        close=host.kvm.close,
        cpuinfo_path=str(tmp_path / "proc" / "cpuinfo"),
        modules_path=str(tmp_path / "proc" / "modules"),
        sys_module_dir=str(tmp_path / "sys_module"),
        machine="x86_64",
    )

    assert readiness.usable, readiness.reason
    assert readiness.check("firecracker_binary").detail == f"{fake_fc}: Firecracker v9.9.9"


def test_binary_path_missing_or_not_executable(host: FakeHost, tmp_path: Path) -> None:
    """A configured path that does not exist, or is not executable, is named in the reason."""
    plain = tmp_path / "not-exec"
    plain.write_text("#!/bin/sh\n")
    plain.chmod(stat.S_IRUSR | stat.S_IWUSR)
    host.probe()

    def detail_for(path: str) -> str:
        return (
            probe(
                host.config(firecracker_bin=path),
                open_device=host.kvm.open,
                ioctl=host.kvm.ioctl,
                close=host.kvm.close,
                cpuinfo_path=str(tmp_path / "proc" / "cpuinfo"),
                modules_path=str(tmp_path / "proc" / "modules"),
                sys_module_dir=str(tmp_path / "sys_module"),
                machine="x86_64",
            )
            .check("firecracker_binary")
            .detail
        )

    assert detail_for(str(tmp_path / "nope")) == f"the firecracker binary {tmp_path / 'nope'} does not exist"
    # No x bit at all: even root may not execute it, so which() refuses it.
    assert detail_for(str(plain)) == f"the firecracker binary {plain} is not an executable file"


def test_custom_binary_name_not_on_path(host: FakeHost) -> None:
    """A custom binary name that is not on PATH is quoted in the reason."""
    readiness = host.probe(host.config(firecracker_bin="fc-1.7"))

    assert readiness.check("firecracker_binary").detail == (
        "the firecracker binary is not installed ('fc-1.7' is not on PATH)"
    )


def test_check_lookup() -> None:
    """Readiness.check finds a check by name and raises KeyError for an unknown one."""
    readiness = Readiness(usable=False, reason="KVM not available: x", checks=(Check("pvm", ok=False, detail="x"),))

    assert readiness.check("pvm").detail == "x"
    assert readiness.failed == readiness.checks
    with pytest.raises(KeyError):
        readiness.check("nope")


# --- the provider -------------------------------------------------------------------------------------------------

PVM_REASON = (
    "KVM not available: /dev/kvm is backed by PVM (kvm_pvm module), a paravirtualised KVM that Firecracker's stock "
    "guest kernels cannot boot on; and the firecracker binary is not installed (not on PATH)"
)
BAD = Readiness(
    usable=False,
    reason=PVM_REASON,
    checks=(
        Check("kvm_device", ok=True, detail="/dev/kvm opened read-write"),
        Check("pvm", ok=False, detail="/dev/kvm is backed by PVM"),
        Check("firecracker_binary", ok=False, detail="the firecracker binary is not installed (not on PATH)"),
    ),
)
GOOD = Readiness(usable=True, reason="Firecracker microVMs can run", checks=(Check("pvm", ok=True, detail="no"),))


class CountingProbe:
    """A probe double that returns a fixed answer and counts its calls."""

    def __init__(self, answer: Readiness) -> None:
        self.answer = answer
        self.calls = 0

    def __call__(self, config: ReadinessConfig) -> Readiness:
        self.calls += 1
        return self.answer


def provider_with(answer: Readiness, clock: Callable[[], float] | None = None) -> tuple[FirecrackerProvider, Any]:
    counting = CountingProbe(answer)
    if clock is None:
        return FirecrackerProvider(ReadinessConfig(), probe=counting), counting
    return FirecrackerProvider(ReadinessConfig(), probe=counting, clock=clock), counting


async def test_provider_health_reports_the_reason() -> None:
    """health is unhealthy with the probe's reason and a per-check details map."""
    provider, _ = provider_with(BAD)

    health = await provider.health()

    assert not health.healthy
    assert health.error == PVM_REASON
    assert health.details["pvm"] == {"ok": False, "detail": "/dev/kvm is backed by PVM", "skipped": False}
    assert health.details["kvm_device"] == {"ok": True, "detail": "/dev/kvm opened read-write", "skipped": False}


async def test_provider_health_is_cached_for_ten_seconds() -> None:
    """The probe runs once per 10 s however often health is asked."""
    now = [1000.0]
    provider, counting = provider_with(BAD, clock=lambda: now[0])

    await provider.health()
    now[0] += READINESS_CACHE_S - 0.5
    await provider.health()
    await provider.capabilities()
    assert counting.calls == 1

    now[0] += 1.0
    await provider.health()
    assert counting.calls == 2


async def test_provider_create_refuses_with_kvm_not_available() -> None:
    """create on an unusable host raises ProviderUnavailableError whose message starts with the seed's phrase."""
    provider, _ = provider_with(BAD)

    with pytest.raises(ProviderUnavailableError) as caught:
        await provider.create(WorkspaceSpec(id="ws-1", image="corral/workspace:base"))

    assert str(caught.value).startswith("firecracker: KVM not available: ")
    assert caught.value.provider == "firecracker"
    assert caught.value.reason == PVM_REASON


async def test_provider_create_does_not_pretend_on_a_usable_host() -> None:
    """On a usable host without kernel and rootfs configured, create says which settings are missing."""
    provider, _ = provider_with(GOOD)

    assert (await provider.health()).healthy
    with pytest.raises(ProviderUnavailableError, match=r"no guest kernel or rootfs configured"):
        await provider.create(WorkspaceSpec(id="ws-1", image="corral/workspace:base"))


async def test_provider_has_no_workspaces() -> None:
    """destroy is an idempotent no-op, state is missing, the list is empty, and workspace calls raise not-found."""
    provider, _ = provider_with(BAD)

    await provider.destroy("ws-1")
    await provider.destroy("ws-1")
    assert await provider.state("ws-1") is WorkspaceState.MISSING
    assert await provider.list_workspaces() == []
    with pytest.raises(WorkspaceNotFoundError, match="workspace ws-1 does not exist"):
        await provider.exec("ws-1", ExecRequest(command="true"))
    with pytest.raises(WorkspaceNotFoundError):
        async for _ in provider.exec_stream("ws-1", ExecRequest(command="true")):
            pass
    with pytest.raises(WorkspaceNotFoundError):
        await provider.read_file("ws-1", "/workspace/a")
    with pytest.raises(WorkspaceNotFoundError):
        await provider.write_file("ws-1", "/workspace/a", b"x")
    with pytest.raises(WorkspaceNotFoundError):
        await provider.stop("ws-1")
    with pytest.raises(WorkspaceNotFoundError):
        await provider.resume("ws-1")
    with pytest.raises(WorkspaceNotFoundError):
        await provider.glob("ws-1", "**")
    await provider.aclose()


async def test_provider_capabilities() -> None:
    """capabilities describe microVM workspaces and carry whether KVM is usable and why."""
    provider, _ = provider_with(BAD)

    caps = await provider.capabilities()

    assert caps.isolation == "microvm"
    assert (caps.persistence, caps.snapshots, caps.pause) == ("full", "memory", "memory")
    assert (caps.warm_pool, caps.streaming) == (True, True)
    assert caps.disk_limit == "enforced"
    assert caps.requirements == ("kvm", "firecracker")
    assert caps.startup_latency_ms == 125.0
    assert (caps.resources["kvm_usable"], caps.resources["reason"]) == (False, PVM_REASON)


def test_provider_satisfies_the_protocol() -> None:
    """FirecrackerProvider is a WorkspaceProvider named "firecracker"."""
    provider, _ = provider_with(BAD)

    assert isinstance(provider, WorkspaceProvider)
    assert provider.name == "firecracker"


def test_from_settings_reads_the_firecracker_fields() -> None:
    """from_settings maps firecracker_bin/_kernel/_rootfs onto the readiness config, with defaults when absent."""
    configured = Settings(firecracker_bin="/opt/fc", firecracker_kernel="/k/vmlinux", firecracker_rootfs="/r.ext4")
    assert from_settings(configured).config == ReadinessConfig(
        firecracker_bin="/opt/fc", kernel_path="/k/vmlinux", rootfs_path="/r.ext4"
    )
    assert from_settings(Settings()).config == ReadinessConfig()
