"""Network rules through the unmodified E2B SDK against a real Corral server on gVisor: ``deny_out`` addresses and
CIDRs, ``allow_out`` over deny, host names let through by SNI/Host and dialled by name, ``update_network``, rules
that outlive a pause, and what a hostile sandbox tries (marking its own packets, naming an allowed host to another
address).

The destinations are two HTTP servers in containers this module starts on Docker's bridge (plain runc, the base
image's python3); nothing here reaches past them. Host names resolve through ``CORRAL_EGRESS_HOSTS_FILE``.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import BASE_IMAGE, Server, start_server, stop_server
from tests.e2e.test_e2b_sdk import run_user_script

pytestmark = pytest.mark.e2e

ALLOWED_NAME = "allowed.corral.test"
OTHER_NAME = "other.corral.test"


UDP_ECHO = (
    "import socket, threading\n"
    "def echo(port):\n"
    ' s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", port))\n'
    " while True:\n  data, peer = s.recvfrom(100); s.sendto(data, peer)\n"
    "threading.Thread(target=echo, args=(53,)).start(); echo(9999)"
)


def _container(name: str) -> str:
    """Start an HTTP server container answering its own name; return its bridge address."""
    subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)
    serve = (
        f"mkdir -p /srv && echo {name} > /srv/who && cd /srv && (python3 -c '{UDP_ECHO}' &) && "
        "exec python3 -m http.server 8080"
    )
    subprocess.run(
        [
            *("docker", "run", "-d", "--rm", "--name", name, "--cap-drop", "ALL", "--cap-add", "NET_BIND_SERVICE"),
            BASE_IMAGE,
            "sh",
            "-c",
            serve,
        ],
        check=True,
        capture_output=True,
    )
    info = json.loads(subprocess.run(["docker", "inspect", name], check=True, capture_output=True).stdout)[0]
    address: str = info["NetworkSettings"]["IPAddress"]
    assert address, f"container {name} has no bridge address"
    return address


@pytest.fixture(scope="module", name="targets")
def targets_fixture() -> Iterator[dict[str, str]]:
    """Two destinations, ``a`` and ``b``, each an HTTP server on port 8080 answering /who with its name."""
    if subprocess.run(["docker", "image", "inspect", BASE_IMAGE], capture_output=True, check=False).returncode != 0:
        pytest.skip(f"Docker engine or base image {BASE_IMAGE} not available; run `make bootstrap`")
    suffix = uuid.uuid4().hex[:8]
    names = {"a": f"corral-egress-a-{suffix}", "b": f"corral-egress-b-{suffix}"}
    try:
        addresses = {key: _container(name) for key, name in names.items()}
        yield {**addresses, **{f"{key}_name": name for key, name in names.items()}}
    finally:
        for name in names.values():
            subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)


@pytest.fixture(scope="module", name="e2b_server")
def e2b_server_fixture(tmp_path_factory: pytest.TempPathFactory, targets: dict[str, str]) -> Iterator[Server]:
    """A server on gVisor whose egress proxy resolves the test's host names to target ``a``."""
    data_dir = tmp_path_factory.mktemp("corral-e2b-network")
    hosts = data_dir / "egress-hosts"
    hosts.write_text(f"{targets['a']} {ALLOWED_NAME} {OTHER_NAME}\n")
    # The targets stand for the internet here: let workspaces reach their bridge (denied by default, see below).
    env = {"CORRAL_PROVIDERS": "gvisor", "CORRAL_EGRESS_HOSTS_FILE": str(hosts), "CORRAL_EGRESS_ALWAYS_DENY": ""}
    server = start_server(data_dir, env)
    try:
        yield server
    finally:
        stop_server(server)


# What every script does: fetch URLs from inside the sandbox, each answer's body or the failure's class.
PROBE = """
import json
from e2b import CommandExitException, Sandbox

def fetch(sandbox, url, *extra):
    cmd = "curl -sS --max-time 5 " + " ".join(extra) + " " + url
    try:
        return sandbox.commands.run(cmd, timeout=30).stdout.strip()
    except CommandExitException as exc:
        return "failed: " + str(exc.exit_code)
"""


def _script(server: Server, tmp_path: Path, body: str) -> dict[str, Any]:
    return run_user_script(server, tmp_path, PROBE + body)


def test_deny_one_address_and_allow_the_other(e2b_server: Server, targets: dict[str, str], tmp_path: Path) -> None:
    """``deny_out`` holding one address blocks it and leaves the other reachable; the detail shows the rules."""
    a, b = targets["a"], targets["b"]
    report = _script(
        e2b_server,
        tmp_path,
        f"""
sandbox = Sandbox.create(network={{"deny_out": ["{a}"]}})
out = {{"a": fetch(sandbox, "http://{a}:8080/who"), "b": fetch(sandbox, "http://{b}:8080/who")}}
out["a_udp"] = sandbox.commands.run(
    "python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2)\\n"
    "try:\\n s.connect((\\"{a}\\", 9)); s.send(b\\"x\\"); s.recv(1); print(\\"answered\\")\\n"
    "except OSError as e: print(type(e).__name__)'"
).stdout.strip()
info = Sandbox.get_info(sandbox.sandbox_id)
out["network"] = getattr(info, "network", None)
sandbox.kill()
print(json.dumps(out, default=str))
""",
    )
    assert report["a"].startswith("failed"), report
    assert report["b"] == targets["b_name"], report
    # Rejected at once (the sender hears EPERM, or the ICMP error), never silently dropped.
    assert report["a_udp"] in ("PermissionError", "ConnectionRefusedError"), report
    assert a in str(report["network"]), report


def test_allow_over_deny_all(e2b_server: Server, targets: dict[str, str], tmp_path: Path) -> None:
    """``allow_internet_access=False`` with ``allow_out`` gives a networked sandbox where only the allowed address
    answers; a sandbox that marks its own packets as the proxy's gets nothing more."""
    a, b = targets["a"], targets["b"]
    report = _script(
        e2b_server,
        tmp_path,
        f"""
sandbox = Sandbox.create(allow_internet_access=False, network={{"allow_out": ["{b}/32"]}})
out = {{"a": fetch(sandbox, "http://{a}:8080/who"), "b": fetch(sandbox, "http://{b}:8080/who")}}
out["marked"] = sandbox.commands.run(
    "python3 -c 'import socket; s=socket.socket(); s.settimeout(3)\\n"
    "try:\\n s.setsockopt(socket.SOL_SOCKET, 36, 0xC0E5)\\nexcept OSError: pass\\n"
    "try:\\n s.connect((\\"{a}\\", 8080)); print(\\"connected\\")\\nexcept OSError as e: print(type(e).__name__)'"
).stdout.strip()
sandbox.kill()
print(json.dumps(out))
""",
    )
    assert report["a"].startswith("failed"), report
    assert report["b"] == targets["b_name"], report
    assert report["marked"] in ("ConnectionRefusedError", "TimeoutError", "PermissionError"), report


def test_host_names_are_let_through_by_name(e2b_server: Server, targets: dict[str, str], tmp_path: Path) -> None:
    """With everything denied and a host name allowed, a request naming that host reaches it; naming another host,
    or none, gets nothing, even at the allowed host's own address; and the proxy dials the *name*, so naming the
    allowed host at another address still reaches the allowed host."""
    a, b = targets["a"], targets["b"]
    report = _script(
        e2b_server,
        tmp_path,
        f"""
sandbox = Sandbox.create(network={{"allow_out": ["{ALLOWED_NAME}"], "deny_out": ["0.0.0.0/0"]}})
sandbox.commands.run("echo '{a} {ALLOWED_NAME} {OTHER_NAME}' >> /etc/hosts", user="root")
out = {{
    "by_name": fetch(sandbox, "http://{ALLOWED_NAME}:8080/who"),
    "other_name": fetch(sandbox, "http://{OTHER_NAME}:8080/who"),
    "no_name": fetch(sandbox, "http://{a}:8080/who"),
    "fronted": fetch(sandbox, "http://{b}:8080/who", "-H 'Host: {ALLOWED_NAME}'"),
    "b": fetch(sandbox, "http://{b}:8080/who"),
}}
sandbox.kill()
print(json.dumps(out))
""",
    )
    assert report["by_name"] == targets["a_name"], report
    assert report["other_name"].startswith("failed"), report
    assert report["no_name"].startswith("failed"), report
    assert report["fronted"] == targets["a_name"], report  # went to where the name points, not to b
    assert report["b"].startswith("failed"), report


def test_update_network_replaces_the_rules(e2b_server: Server, targets: dict[str, str], tmp_path: Path) -> None:
    """``update_network`` replaces the rules of a running sandbox at once: deny a, then deny everything but a, then
    nothing; the rules also hold after a pause and resume."""
    a, b = targets["a"], targets["b"]
    report = _script(
        e2b_server,
        tmp_path,
        f"""
sandbox = Sandbox.create()
steps = {{"open": [fetch(sandbox, "http://{a}:8080/who"), fetch(sandbox, "http://{b}:8080/who")]}}
sandbox.update_network({{"deny_out": ["{a}"]}})
steps["deny_a"] = [fetch(sandbox, "http://{a}:8080/who"), fetch(sandbox, "http://{b}:8080/who")]
sandbox.update_network({{"allow_out": ["{a}"], "allow_internet_access": False}})
steps["only_a"] = [fetch(sandbox, "http://{a}:8080/who"), fetch(sandbox, "http://{b}:8080/who")]
sandbox.pause()
sandbox = Sandbox.connect(sandbox.sandbox_id)
steps["resumed"] = [fetch(sandbox, "http://{a}:8080/who"), fetch(sandbox, "http://{b}:8080/who")]
sandbox.update_network({{}})
steps["cleared"] = [fetch(sandbox, "http://{a}:8080/who"), fetch(sandbox, "http://{b}:8080/who")]
sandbox.kill()
print(json.dumps(steps))
""",
    )
    a_name, b_name = targets["a_name"], targets["b_name"]
    assert report["open"] == [a_name, b_name], report
    assert report["deny_a"][0].startswith("failed") and report["deny_a"][1] == b_name, report
    assert report["only_a"][0] == a_name and report["only_a"][1].startswith("failed"), report
    assert report["resumed"][0] == a_name and report["resumed"][1].startswith("failed"), report
    assert report["cleared"] == [a_name, b_name], report


def test_bad_rules_are_refused_with_the_reason(e2b_server: Server, tmp_path: Path) -> None:
    """A host name in ``deny_out``, a malformed entry, transforms and rules on an isolated sandbox are refused in
    E2B's error shape, naming what was wrong; nothing is left behind."""
    report = _script(
        e2b_server,
        tmp_path,
        """
out = {}
for name, kwargs in {
    "deny_host": {"network": {"deny_out": ["example.com"]}},
    "bad_entry": {"network": {"allow_out": ["not a host!"], "deny_out": ["0.0.0.0/0"]}},
    "transform": {"network": {"allow_out": ["x.test"], "rules": {"x.test": [{"transform": {"headers": {"a": "b"}}}]}}},
}.items():
    try:
        Sandbox.create(**kwargs).kill()
        out[name] = "created"
    except Exception as exc:
        out[name] = type(exc).__name__ + ": " + str(exc)
sandbox = Sandbox.create(allow_internet_access=False)
try:
    sandbox.update_network({"allow_out": ["10.0.0.1"]})
    out["isolated_update"] = "updated"
except Exception as exc:
    out["isolated_update"] = type(exc).__name__ + ": " + str(exc)
sandbox.kill()
out["left"] = len(Sandbox.list().next_items())
print(json.dumps(out))
""",
    )
    assert "deny_out" in report["deny_host"] and "host names are allowed only in allow_out" in report["deny_host"]
    assert "'not a host!'" in report["bad_entry"], report
    assert "not supported by Corral" in report["transform"], report
    assert "without network access" in report["isolated_update"], report
    assert report["left"] == 0, report


def test_rules_survive_a_server_restart(tmp_path: Path, targets: dict[str, str]) -> None:
    """A restarted server puts a sandbox's rules back, the name-checking proxy included, and keeps them for its
    next resume."""
    a, b = targets["a"], targets["b"]
    hosts = tmp_path / "egress-hosts"
    hosts.write_text(f"{a} {ALLOWED_NAME}\n")
    env = {"CORRAL_PROVIDERS": "gvisor", "CORRAL_EGRESS_HOSTS_FILE": str(hosts), "CORRAL_EGRESS_ALWAYS_DENY": ""}
    data_dir = tmp_path / "data"
    server = start_server(data_dir, env)
    try:
        created = _script(
            server,
            tmp_path,
            f"""
sandbox = Sandbox.create(network={{"allow_out": ["{ALLOWED_NAME}"], "deny_out": ["0.0.0.0/0"]}}, timeout=600)
sandbox.commands.run("echo '{a} {ALLOWED_NAME}' >> /etc/hosts", user="root")
print(json.dumps({{"id": sandbox.sandbox_id, "before": fetch(sandbox, "http://{ALLOWED_NAME}:8080/who")}}))
""",
        )
        assert created["before"] == targets["a_name"], created
    finally:
        stop_server(server, destroy_workspaces=False)
    server = start_server(data_dir, env)
    try:
        report = _script(
            server,
            tmp_path,
            f"""
sandbox = Sandbox.connect("{created["id"]}")
out = {{"name": fetch(sandbox, "http://{ALLOWED_NAME}:8080/who"), "b": fetch(sandbox, "http://{b}:8080/who")}}
sandbox.kill()
print(json.dumps(out))
""",
        )
        assert report["name"] == targets["a_name"], report
        assert report["b"].startswith("failed"), report
    finally:
        stop_server(server)


def test_by_default_neighbours_the_host_and_metadata_are_out_of_reach(tmp_path: Path, targets: dict[str, str]) -> None:
    """With the default CORRAL_EGRESS_ALWAYS_DENY a networked sandbox with no rules reaches neither another container
    on its bridge nor the host's bridge address; ``allow_out`` naming the neighbour's address opens it; and an
    allowed host name that resolves to the bridge is refused by the proxy too."""
    a = targets["a"]
    # The host's address on the bridge, as the neighbour sees it (the bridge's IPAM config does not always name it).
    gateway = subprocess.run(
        ["docker", "inspect", "-f", "{{.NetworkSettings.Gateway}}", targets["a_name"]],
        capture_output=True, check=True, text=True,
    ).stdout.strip()  # fmt: skip
    assert gateway, "the neighbour has no gateway on the bridge"
    hosts = tmp_path / "egress-hosts"
    hosts.write_text(f"{a} {ALLOWED_NAME}\n")
    server = start_server(tmp_path / "data", {"CORRAL_PROVIDERS": "gvisor", "CORRAL_EGRESS_HOSTS_FILE": str(hosts)})
    try:
        report = _script(
            server,
            tmp_path,
            f"""
plain = Sandbox.create()
opened = Sandbox.create(network={{"allow_out": ["{a}"]}})
named = Sandbox.create(network={{"allow_out": ["{ALLOWED_NAME}"], "deny_out": ["0.0.0.0/0"]}})
named.commands.run("echo '{a} {ALLOWED_NAME}' >> /etc/hosts", user="root")
out = {{
    "neighbour": fetch(plain, "http://{a}:8080/who"),
    "host": fetch(plain, "http://{gateway}:1/"),
    "metadata": fetch(plain, "http://169.254.169.254/"),
    "opened": fetch(opened, "http://{a}:8080/who"),
    "named": fetch(named, "http://{ALLOWED_NAME}:8080/who"),
}}
for sandbox in (plain, opened, named):
    sandbox.kill()
print(json.dumps(out))
""",
        )
    finally:
        stop_server(server)
    assert report["neighbour"].startswith("failed"), report
    assert report["host"].startswith("failed"), report
    assert report["metadata"].startswith("failed"), report
    assert report["opened"] == targets["a_name"], report
    assert report["named"].startswith("failed"), report
    assert "which workspaces may not reach" in server.log() or "always denied" in server.log(), server.log()[-3000:]


# A UDP flow the sandbox keeps open: a datagram to the echo every 0.1 s, each answer counted in /tmp/answers.
UDP_FLOW = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(0.2)
s.connect((sys.argv[1], 9999))
n = 0
while True:
    try:
        s.send(b"x")
        s.recv(10)
        n += 1
        open("/tmp/answers", "w").write(str(n))
    except OSError:
        pass
    time.sleep(0.1)
"""

# One datagram to an address and port: "answered", or the error's class.
UDP_PROBE = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(2)
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
    s.send(b"x")
    s.recv(10)
    print("answered")
except OSError as e:
    print(type(e).__name__)
"""


def test_tightened_rules_cut_flows_already_open_forks_keep_rules_and_resolv_conf_opens_nothing(
    e2b_server: Server, targets: dict[str, str], tmp_path: Path
) -> None:
    """A UDP flow opened while allowed stops getting answers once update_network denies its address; a fork of a
    restricted sandbox has the same rules; and a sandbox that writes another nameserver into its resolv.conf does
    not get DNS to it opened when its rules are applied again."""
    a = targets["a"]
    report = _script(
        e2b_server,
        tmp_path,
        f"""
import time

def answers(sandbox):
    return int(sandbox.commands.run("cat /tmp/answers 2>/dev/null || echo 0").stdout.strip() or 0)

out = {{}}
sandbox = Sandbox.create()
sandbox.files.write("/tmp/flow.py", {UDP_FLOW!r})
sandbox.files.write("/tmp/probe.py", {UDP_PROBE!r})
out["dns_reachable_without_rules"] = sandbox.commands.run("python3 /tmp/probe.py {a} 53").stdout.strip()
sandbox.commands.run("python3 /tmp/flow.py {a}", background=True)
deadline = time.monotonic() + 30
while answers(sandbox) < 3 and time.monotonic() < deadline:
    time.sleep(0.1)
out["before"] = answers(sandbox) >= 3
sandbox.update_network({{"deny_out": ["{a}"]}})
time.sleep(0.5)
first = answers(sandbox)
time.sleep(1.5)
out["after"] = answers(sandbox) - first

(fork,) = sandbox.fork(count=1)
out["fork"] = fetch(fork, "http://{a}:8080/who")
fork.kill()

named = Sandbox.create(network={{"allow_out": ["{ALLOWED_NAME}"], "deny_out": ["0.0.0.0/0"]}})
named.files.write("/tmp/probe.py", {UDP_PROBE!r})
named.commands.run("echo 'nameserver {a}' > /etc/resolv.conf", user="root")
named.update_network({{"allow_out": ["{ALLOWED_NAME}"], "deny_out": ["0.0.0.0/0"]}})
out["dns_to_a"] = named.commands.run("python3 /tmp/probe.py {a} 53").stdout.strip()
named.kill()
sandbox.kill()
print(json.dumps(out))
""",
    )
    assert report["before"] is True, report
    assert report["after"] == 0, report
    assert report["fork"].startswith("failed"), report
    assert report["dns_reachable_without_rules"] == "answered", report  # the probe below can tell
    assert report["dns_to_a"] in ("PermissionError", "ConnectionRefusedError"), report
