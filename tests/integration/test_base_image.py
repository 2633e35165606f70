"""The base image corral/workspace:base as E2B programs expect it, and commands and files as one of its users.

Real gVisor workspaces of the real image: E2B's ``user`` (uid 1000, home /home/user), its tools, and the provider
contract's ``user`` (exec) and ``owner`` (write_file) through the guest agent and the spawner.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from corral.errors import InvalidRequestError
from corral.providers._docker_engine import DockerEngine
from corral.providers.base import ExecRequest, WorkspaceSpec
from corral.providers.gvisor import GVisorProvider
from tests.conftest import BASE_IMAGE

pytestmark = pytest.mark.integration


@pytest.fixture
async def workspace(docker_engine: DockerEngine) -> AsyncIterator[tuple[GVisorProvider, str]]:
    """One isolated gVisor workspace of the base image, destroyed afterwards."""
    provider = GVisorProvider(DockerEngine(docker_engine.socket_path))
    workspace_id = f"t{uuid.uuid4().hex[:15]}"
    try:
        await provider.create(WorkspaceSpec(id=workspace_id, image=BASE_IMAGE))
        yield provider, workspace_id
    finally:
        await provider.destroy(workspace_id)
        await provider.aclose()


async def _sh(provider: GVisorProvider, workspace_id: str, script: str, user: str | None = None) -> str:
    result = await provider.exec(workspace_id, ExecRequest(script, user=user, timeout_s=120))
    assert result.exit_code == 0, (script, result.stdout, result.stderr)
    return result.stdout.decode()


async def test_native_commands_still_run_as_root_in_workspace(workspace: tuple[GVisorProvider, str]) -> None:
    """Without a user, a command runs as root in /workspace with HOME=/root, as before the E2B user existed."""
    provider, workspace_id = workspace
    assert await _sh(provider, workspace_id, 'id -u; pwd; echo "$HOME"') == "0\n/workspace\n/root\n"


async def test_the_image_has_e2b_user_and_tools(workspace: tuple[GVisorProvider, str]) -> None:
    """The image has user 1000 with home /home/user and bash, python with venv and pip, node, npm and build tools."""
    provider, workspace_id = workspace
    assert (await _sh(provider, workspace_id, "id user")).strip() == "uid=1000(user) gid=1000(user) groups=1000(user)"
    passwd = await _sh(provider, workspace_id, "getent passwd user")
    assert passwd.strip() == "user:x:1000:1000::/home/user:/bin/bash"
    assert (await _sh(provider, workspace_id, "stat -c %u:%g /home/user")).strip() == "1000:1000"
    assert (await _sh(provider, workspace_id, "cat /etc/sudoers.d/user")).strip() == "user ALL=(ALL:ALL) NOPASSWD: ALL"
    venv = "cd ~ && python -m venv v && v/bin/python -c 'import sys; print(sys.prefix)' && v/bin/pip --version"
    out = await _sh(provider, workspace_id, venv, user="user")
    assert out.startswith("/home/user/v\npip ")
    assert (await _sh(provider, workspace_id, "python3 -m pip --version")).startswith("pip ")
    assert (await _sh(provider, workspace_id, "node -v")).startswith("v")
    assert (await _sh(provider, workspace_id, "npm -v"))[0].isdigit()
    build = "cd /tmp && printf 'int main(void){return 7;}' > m.c && printf 'm: m.c\\n\\tgcc -o m m.c\\n' > Makefile"
    await _sh(provider, workspace_id, build + " && make -s m", user="user")
    result = await provider.exec(workspace_id, ExecRequest("/tmp/m", user="user"))
    assert result.exit_code == 7
    assert (await _sh(provider, workspace_id, "echo '{\"a\": [1, 2]}' | jq -c .a")).strip() == "[1,2]"
    assert (await _sh(provider, workspace_id, "unzip -v | head -1")).startswith("UnZip 6")
    assert (await _sh(provider, workspace_id, "curl --version | head -1")).startswith("curl ")
    assert (await _sh(provider, workspace_id, "git --version")).startswith("git version")


async def test_sudo_cannot_make_user_root_in_a_hardened_workspace(workspace: tuple[GVisorProvider, str]) -> None:
    """The image grants ``user`` passwordless sudo as E2B's does, but workspaces run with no-new-privileges, so set-uid
    programs cannot raise privileges: sudo refuses and says why (root is had with ``user="root"`` instead)."""
    provider, workspace_id = workspace
    result = await provider.exec(workspace_id, ExecRequest("sudo -n id -u", user="user"))
    assert result.exit_code != 0
    assert b"no new privileges" in result.stderr


async def test_a_command_runs_as_the_user_with_its_environment(workspace: tuple[GVisorProvider, str]) -> None:
    """``ExecRequest.user`` runs the command as that user, with HOME, USER and LOGNAME set for it; env overrides."""
    provider, workspace_id = workspace
    out = await _sh(provider, workspace_id, 'whoami; id -u; id -g; id -G; echo "$HOME $USER $LOGNAME"', user="user")
    assert out == "user\n1000\n1000\n1000\n/home/user user user\n"
    assert (await _sh(provider, workspace_id, "whoami; echo $HOME", user="root")) == "root\n/root\n"
    result = await provider.exec(workspace_id, ExecRequest("echo $HOME", user="user", env={"HOME": "/tmp"}))
    assert result.stdout == b"/tmp\n"


async def test_a_file_written_for_a_user_belongs_to_it(workspace: tuple[GVisorProvider, str]) -> None:
    """``write_file(owner=...)`` leaves the file owned by the user's uid and gid, and the user can rewrite it."""
    provider, workspace_id = workspace
    await provider.write_file(workspace_id, "/home/user/a.txt", b"hello", owner="user")
    await provider.write_file(workspace_id, "/home/user/r.txt", b"root")
    stats = await _sh(provider, workspace_id, "stat -c '%U:%G %u:%g' /home/user/a.txt /home/user/r.txt")
    assert stats == "user:user 1000:1000\nroot:root 0:0\n"
    assert await _sh(provider, workspace_id, "echo more >> ~/a.txt && cat ~/a.txt", user="user") == "hellomore\n"


async def test_an_unknown_user_is_refused_by_name(workspace: tuple[GVisorProvider, str]) -> None:
    """A user missing from the workspace's /etc/passwd fails exec and write_file with an error naming it."""
    provider, workspace_id = workspace
    with pytest.raises(InvalidRequestError, match="nobody-here"):
        await provider.exec(workspace_id, ExecRequest("true", user="nobody-here"))
    with pytest.raises(InvalidRequestError, match="nobody-here"):
        await provider.write_file(workspace_id, "/tmp/x", b"x", owner="nobody-here")
    with pytest.raises(InvalidRequestError, match="user"):
        await provider.exec(workspace_id, ExecRequest("true", user="a:b"))


# What the E2B SDK runs for every command is ``/bin/bash -l -c CMD``: pids are handed out in order in a workspace, so
# the process started right after that login shell has the next pid only if the login files started none of their
# own (``; true`` keeps sh from exec'ing its last command in place).
_LOGIN_FORKS = "bash -l -c 'echo $$'; sh -c 'echo $$'; true"


@pytest.mark.parametrize("user", ["user", "root"])
async def test_a_login_shell_starts_no_process(workspace: tuple[GVisorProvider, str], user: str) -> None:
    """``bash -l -c`` reads the login files without forking (no ``$(id -u)`` or ``mesg``), as E2B's user and root."""
    provider, workspace_id = workspace
    login, after = (int(pid) for pid in (await _sh(provider, workspace_id, _LOGIN_FORKS, user=user)).split())
    # The only other process started meanwhile may be the agent's spawner forking its next idle handler beside the
    # command; that handler starts the next command, so it is that command's parent.
    next_handler = int(await _sh(provider, workspace_id, "echo $PPID", user=user))
    started = set(range(login + 1, after)) - {next_handler}
    assert not started, f"the login files of {user} started {len(started)} process(es): pids {sorted(started)}"


async def test_a_login_shell_keeps_debian_behaviour(workspace: tuple[GVisorProvider, str]) -> None:
    """Login shells still get Debian's PATH per user and umask, run /etc/profile.d, and interactive ones ~/.bashrc;
    sh (no ``$EUID``) still reads /etc/profile right."""
    provider, workspace_id = workspace
    await provider.write_file(workspace_id, "/etc/profile.d/corral-test.sh", b"export FROM_PROFILE_D=yes\n")
    show = 'bash -l -c \'echo "$PATH"; umask; echo "$FROM_PROFILE_D"\''
    user_path = "/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games"
    root_path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert await _sh(provider, workspace_id, show, user="user") == f"{user_path}\n0022\nyes\n"
    assert await _sh(provider, workspace_id, show, user="root") == f"{root_path}\n0022\nyes\n"
    assert await _sh(provider, workspace_id, "sh -l -c 'echo \"$PATH\"'", user="user") == f"{user_path}\n"
    interactive = "bash -l -i -c 'alias ls; echo \"$HISTSIZE\"' 2>/dev/null"
    assert await _sh(provider, workspace_id, interactive, user="user") == "alias ls='ls --color=auto'\n1000\n"
