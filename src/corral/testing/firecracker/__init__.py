"""A TEST DOUBLE of the ``firecracker`` binary: its published API, enforced, with a guest emulated without KVM.

Corral's machines cannot boot a microVM (PVM KVM, no firecracker binary; see the README), so the manager, the VM
driver and the provider are exercised against this stand-in. It is never selected by any production path: it runs
only where a test (or an operator experimenting) points the manager's ``firecracker_cmd`` at
``python -m corral.testing.firecracker``. It takes the same arguments as the real binary
(``--api-sock PATH --id ID``) and serves the same API on the Unix socket, checking what Firecracker 1.12.0 checks
(the version it reports, ``1.12.0-corral-double``, and the only one whose fields it accepts):

* paths and methods of ``firecracker.yaml`` (the parts the double implements: no balloon, MMDS, entropy or CPU
  templates); anything else is ``400 {"fault_message": "Invalid request method and/or path: ..."}``;
* bodies: JSON objects with the required fields, the right types and no unknown fields (Firecracker's structs
  deny unknown fields; fields newer than 1.12, such as ``mtu``, are unknown), ``vcpu_count`` in 1..32 (1 or even
  with SMT), ``guest_cid >= 3``, path ids equal to body ids, one root drive, backing files and the kernel that
  exist, a TAP device that exists and can be attached (``TUNSETIFF`` on ``/dev/net/tun``, as Firecracker does), a
  vsock ``uds_path`` that is free (bound at ``PUT /vsock``);
* the state machine: ``boot-source``, ``machine-config``, ``drives``, ``network-interfaces`` and ``vsock`` are
  pre-boot only, ``PATCH`` of drives and network interfaces, ``PATCH /vm`` and ``SendCtrlAltDel`` are post-boot
  only, ``InstanceStart`` needs a kernel and happens once; ``PUT /snapshot/create`` needs a paused VM and
  ``PUT /snapshot/load`` a fresh process (see :mod:`~corral.testing.firecracker.api`);
* fault messages with Firecracker's prefixes ("Start microvm error: ", "Drive config error: ", "Load snapshot
  error: ", "Create snapshot error: ", ...) and status 400, also for the double's own I/O errors. The prefixes and
  the messages Firecracker's tests pin are Firecracker's; the inner texts of some others are approximations.

What the double cannot do is run a guest kernel or keep guest memory. At ``InstanceStart`` it emulates the guest
instead (the :class:`ChrootGuest`): it loop-mounts the root drive read-write in a private mount namespace, starts
the rootfs's own ``/sbin/corral-init`` chrooted into it as PID 1 of a new PID namespace, and relays Firecracker's
hybrid vsock (``CONNECT <port>\\n`` -> ``OK <host_port>\\n``, then raw bytes) to the Unix sockets the emulated init
listens on, with Firecracker's timing (a request waits for the guest's driver and is dropped after 2000 ms). A
paused VM's guest processes are stopped (SIGSTOP). ``SendCtrlAltDel`` is accepted and reaches the guest as SIGINT
to its init only when its "keyboard" is up (its init runs; never with ``--no-keyboard``), as i8042 key codes do;
when the guest's init exits, the double exits, as Firecracker does when its guest reboots. A snapshot writes a JSON
state file and a sparse memory file holding no memory; loading it reopens the recorded devices and boots the
guest's init again on the disk. So the disk file, the init script, the agent, the vsock protocol and the order and
rules of the API calls are all the real ones; the CPU virtualisation, the guest kernel, virtio, and a real
Firecracker process saving and restoring real guest memory (processes surviving a pause) are not.

============  =====================================================================================================
``schema``    the request bodies Firecracker accepts, checked as serde does; :class:`ApiFault`, every refusal
``guest``     what runs at InstanceStart instead of a kernel: :class:`NoGuest`, :class:`ChrootGuest`
``vsock``     :class:`VsockRelay`, Firecracker's host side of hybrid vsock, relayed to the emulated guest
``api``       :class:`ApiDouble`, the API state machine: paths, pre-/post-boot rules, TAP devices, the boot
``server``    the API over HTTP on the Unix socket, and the program (``serve``, ``main``)
============  =====================================================================================================
"""

from __future__ import annotations

from corral.testing.firecracker.api import ApiDouble
from corral.testing.firecracker.guest import ChrootGuest, Guest, NoGuest
from corral.testing.firecracker.schema import ApiFault
from corral.testing.firecracker.server import main, serve, start_api_server
from corral.testing.firecracker.vsock import VsockRelay

__all__ = [
    "ApiDouble",
    "ApiFault",
    "ChrootGuest",
    "Guest",
    "NoGuest",
    "VsockRelay",
    "main",
    "serve",
    "start_api_server",
]
