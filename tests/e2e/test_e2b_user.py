"""E2B's default user and home through the unmodified E2B SDK: ``user`` in /home/user, root when asked."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import Server, serving_e2b
from tests.e2e.test_e2b_sdk import run_user_script

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module", name="e2b_server")
def e2b_server_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One Corral server on gVisor for the module; skips (a failure under CI) without Docker or the base image."""
    with serving_e2b(tmp_path_factory, "corral-e2b-user") as server:
        yield server


def test_commands_and_files_act_as_user_in_its_home(e2b_server: Server, tmp_path: Path) -> None:
    """Commands run as ``user`` in /home/user (root when asked, in /root); ``~`` and relative paths resolve to the
    user's home, and a file written as ``user`` belongs to it."""
    report = run_user_script(
        e2b_server,
        tmp_path,
        """
        import json
        from e2b import Sandbox

        sandbox = Sandbox.create()
        try:
            report = {
                "whoami": sandbox.commands.run("whoami").stdout,
                "pwd": sandbox.commands.run("pwd").stdout,
                "env": sandbox.commands.run('echo "$HOME $USER $LOGNAME"').stdout,
                "root": sandbox.commands.run("whoami; pwd", user="root").stdout,
                "tilde": sandbox.files.write("~/a.txt", "hi").path,
                "relative": sandbox.files.write("b.txt", "there").path,
                "owners": sandbox.commands.run("stat -c '%n %U:%G' /home/user/a.txt /home/user/b.txt").stdout,
                "read": sandbox.files.read("a.txt"),
                "root_write": sandbox.files.write("r.txt", "r", user="root").path,
                "root_owner": sandbox.commands.run("stat -c %U /root/r.txt", user="root").stdout,
            }
        finally:
            sandbox.kill()
        print(json.dumps(report))
        """,
    )
    assert report["whoami"] == "user\n"
    assert report["pwd"] == "/home/user\n"
    assert report["env"] == "/home/user user user\n"
    assert report["root"] == "root\n/root\n"
    assert (report["tilde"], report["relative"]) == ("/home/user/a.txt", "/home/user/b.txt")
    assert report["owners"] == "/home/user/a.txt user:user\n/home/user/b.txt user:user\n"
    assert report["read"] == "hi"
    assert (report["root_write"], report["root_owner"]) == ("/root/r.txt", "root\n")
