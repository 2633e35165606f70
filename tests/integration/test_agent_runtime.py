"""The agent runtime directory: built once per agent version, and the runtimes of earlier versions collected once no
workspace container mounts them."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

from corral.providers._docker_engine import DockerEngine
from corral.providers.agent_runtime import COLLECT_AFTER_S, AgentRuntime
from corral.providers.docker import LABEL_ID
from tests.conftest import BASE_IMAGE


def _unmount_all(root: Path) -> None:
    for directory in root.iterdir():  # a bind mount onto itself: os.path.ismount cannot tell; umount can
        if directory.is_dir():
            subprocess.run(["umount", str(directory)], check=False, stderr=subprocess.DEVNULL)


def _old_runtime(root: Path, name: str) -> Path:
    directory = root / name
    (directory / "lib").mkdir(parents=True)
    (directory / "agent.py").write_text("# an earlier agent\n")
    past = time.time() - COLLECT_AFTER_S - 60
    os.utime(directory, (past, past))
    return directory


async def test_earlier_runtimes_are_removed_unless_a_container_mounts_them_or_they_are_recent(
    tmp_path: Path, docker_engine: DockerEngine
) -> None:
    """ensure() builds the current runtime and removes an old unmounted one; an old one a (stopped) workspace
    container still mounts, and a recent one another process may be about to use, stay."""
    root = tmp_path / "runtimes"
    unused = _old_runtime(root, "0000000000000001")
    mounted = _old_runtime(root, "0000000000000002")
    recent = root / "0000000000000003"
    (recent / "lib").mkdir(parents=True)
    name = f"corral-test-runtime-{uuid.uuid4().hex[:8]}"
    config = {
        "Image": BASE_IMAGE,
        "Cmd": ["true"],
        "Labels": {LABEL_ID: name},
        "HostConfig": {"Mounts": [{"Type": "bind", "Source": str(mounted), "Target": "/.corral", "ReadOnly": True}]},
    }
    await docker_engine.create_container(name, config)
    runtime = AgentRuntime(docker_engine, image=BASE_IMAGE, root=root)
    try:
        current = Path(await runtime.ensure())
        assert (current / "spawner").is_file() and (current / "agent.py").is_file()
        assert not unused.exists()
        assert mounted.exists() and recent.exists()
    finally:
        await docker_engine.remove_container(name)
        _unmount_all(root)  # ensure() sealed the current one as a read-only mount: undo it


async def test_a_runtime_collected_under_a_running_server_is_built_again(
    tmp_path: Path, docker_engine: DockerEngine
) -> None:
    """When another Corral process removed the runtime this one uses (no container mounted it), the next ensure()
    builds it again instead of handing out a path that no longer exists."""
    root = tmp_path / "runtimes"
    runtime = AgentRuntime(docker_engine, image=BASE_IMAGE, root=root)
    try:
        first = Path(await runtime.ensure())
        _unmount_all(root)
        shutil.rmtree(first)
        again = Path(await runtime.ensure())
        assert (again / "agent.py").is_file() and (again / "spawner").is_file()
    finally:
        _unmount_all(root)
