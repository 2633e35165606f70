"""The unmodified E2B SDK's ``Template`` builder against a real Corral server: builds on the local Docker engine.

Each test runs a user script that imports ``e2b`` and nothing of Corral (configured by ``E2B_API_URL``,
``E2B_SANDBOX_URL`` and ``E2B_API_KEY`` only), then checks the Docker side: the template's image, no build container
left behind, no dangling image. Every template image a test builds is removed by the ``templates`` fixture.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BASE_IMAGE
from tests.e2e.conftest import TOKEN, Server, serving_e2b

pytestmark = pytest.mark.e2e

REPO = "corral-templates"


@pytest.fixture(scope="module", name="e2b_server")
def e2b_server_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One Corral server on gVisor for the module; skips (a failure under CI) without Docker or the base image."""
    with serving_e2b(tmp_path_factory, "corral-e2b-templates") as server:
        yield server


def _docker(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=False).stdout.strip()


def _template_images(name: str) -> list[str]:
    """Ids of every image (intermediate ones too) labelled as a build of template ``name``."""
    return _docker("images", "-a", "-q", "--no-trunc", "--filter", f"label=corral.e2b.template={name}").split()


def _build_containers() -> list[str]:
    return _docker("ps", "-a", "-q", "--filter", "name=corral-e2b-build-").split()


@pytest.fixture(name="templates")
def templates_fixture() -> Iterator[list[str]]:
    """Names for the test's templates; afterwards every image of them is removed, and no build container is left."""
    names: list[str] = []
    yield names
    for name in names:
        for image in set(_template_images(name)):
            subprocess.run(["docker", "rmi", "-f", image], capture_output=True, check=False)
    assert _build_containers() == [], "a template build left its container behind"


def new_name(templates: list[str]) -> str:
    """A fresh template name, removed after the test."""
    name = f"corral-test-{uuid.uuid4().hex[:10]}"
    templates.append(name)
    return name


def run_user_script(server: Server, workdir: Path, source: str) -> dict[str, Any]:
    """Run ``source`` as a user's script in ``workdir`` with only the E2B_* variables set; its last line is JSON."""
    script = workdir / "user_script.py"
    epilogue = "\nimport os as _os, sys as _sys\n_sys.stdout.flush()\n_os._exit(0)\n"
    script.write_text(textwrap.dedent(source) + epilogue)
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    env |= {
        "E2B_API_URL": f"{server.url}/e2b",
        "E2B_SANDBOX_URL": f"{server.url}/e2b/envd",
        "E2B_API_KEY": TOKEN,
        "BASE_IMAGE": BASE_IMAGE,
    }
    proc = subprocess.run(
        [sys.executable, str(script)], env=env, cwd=workdir, capture_output=True, text=True, timeout=280, check=False
    )
    assert proc.returncode == 0, f"user script failed:\n{proc.stderr}\n--- server log ---\n{server.log()[-5000:]}"
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return report


def test_build_with_run_and_copy_then_create_a_sandbox(
    e2b_server: Server, tmp_path: Path, templates: list[str]
) -> None:
    """Template.build from the base image with run_cmd, env, copy of a file and of a directory: the logs carry the
    command's output, exists() is true, and Sandbox.create(name) sees the files (owned by ``user``) and the command's
    effect; one image is left, labelled, with no build container or intermediate image."""
    name = new_name(templates)
    (tmp_path / "hello.txt").write_text("hello from the context\n")
    (tmp_path / "data" / "nested").mkdir(parents=True)
    (tmp_path / "data" / "nested" / "deep.txt").write_text("deep\n")
    report = run_user_script(
        e2b_server,
        tmp_path,
        f"""
        import json, os
        from e2b import Sandbox, Template

        template = (
            Template()
            .from_image(os.environ["BASE_IMAGE"])
            .set_envs({{"GREETING": "built-with-env"}})
            .run_cmd('echo "marker:$GREETING:$(whoami):$(pwd)" && echo built > /home/user/built.txt')
            .copy("hello.txt", "/home/user/")
            .copy("data", "/opt/data", mode=0o750)
        )
        logs = []
        info = Template.build(template, "{name}", on_build_logs=lambda entry: logs.append(entry.message))
        sandbox = Sandbox.create("{name}")
        try:
            files = sandbox.commands.run(
                "cat /home/user/hello.txt /home/user/built.txt /opt/data/nested/deep.txt;"
                " stat -c '%U %a' /home/user/hello.txt /opt/data/nested/deep.txt"
            ).stdout
        finally:
            sandbox.kill()
        print(json.dumps({{
            "template_id": info.template_id, "tags": info.tags, "logs": logs, "files": files,
            "exists": Template.exists("{name}"), "missing": Template.exists("{name}-absent"),
        }}))
        """,
    )
    assert report["template_id"] == name
    assert report["tags"] == ["default"]
    assert any("marker:built-with-env:user:/home/user" in line for line in report["logs"]), report["logs"]
    assert report["files"].splitlines() == [
        "hello from the context",
        "built",
        "deep",
        "user 644",
        "user 750",
    ]
    assert report["exists"] is True
    assert report["missing"] is False
    assert len(_template_images(name)) == 1, "a build leaves exactly one image (no intermediate ones)"
    assert _docker("image", "inspect", f"{REPO}/{name}:default", "--format", "{{.Config.Labels}}") != ""


def test_tags_aliases_and_delete(e2b_server: Server, tmp_path: Path, templates: list[str]) -> None:
    """Build name:v1 with an extra tag, assign and remove tags, rebuild a tag twice (the build left without tags is
    removed rather than left dangling), start a sandbox from name:tag, then delete the template: exists() turns
    false and its images are gone."""
    name = new_name(templates)
    report = run_user_script(
        e2b_server,
        tmp_path,
        f"""
        import json
        from e2b import Sandbox, Template

        base = Template().from_template("base")
        first = Template.build(base.run_cmd("echo one > /home/user/version"), "{name}:v1", tags=["stable"])
        tags_built = sorted(t.tag for t in Template.get_tags("{name}"))
        assigned = Template.assign_tags("{name}:v1", ["prod"])
        Template.remove_tags("{name}", "stable")
        after_remove = sorted(t.tag for t in Template.get_tags("{name}"))
        second = Template.build(
            Template().from_template("{name}:v1").run_cmd("echo two > /home/user/version"), "{name}:prod"
        )
        tags_by_build = sorted((t.tag, t.build_id == second.build_id) for t in Template.get_tags("{name}"))
        third = Template.build(
            Template().from_template("{name}:v1").run_cmd("echo three > /home/user/version"), "{name}:prod"
        )
        sandbox = Sandbox.create("{name}:prod")
        try:
            version = sandbox.commands.run("cat /home/user/version").stdout.strip()
        finally:
            sandbox.kill()
        builds = sorted({{t.build_id for t in Template.get_tags("{name}")}})
        print(json.dumps({{
            "tags_built": tags_built, "assigned": assigned.tags, "assigned_build": assigned.build_id == first.build_id,
            "after_remove": after_remove, "tags_by_build": tags_by_build, "version": version,
            "builds": builds, "expected_builds": sorted([first.build_id, third.build_id]),
        }}))
        """,
    )
    assert len(set(_template_images(name))) == 2, "the second build, left without tags, is removed"
    deleted = e2b_server.client.delete(f"/e2b/templates/{name}", headers={"X-API-KEY": TOKEN})
    assert deleted.status_code == 204, deleted.text
    exists = e2b_server.client.get(f"/e2b/templates/aliases/{name}", headers={"X-API-KEY": TOKEN})
    assert exists.status_code == 404
    assert exists.json()["code"] == 404
    assert report["tags_built"] == ["stable", "v1"]
    assert report["assigned"] == ["prod"]
    assert report["assigned_build"] is True
    assert report["after_remove"] == ["prod", "v1"]
    assert report["tags_by_build"] == [["prod", True], ["v1", False]]
    assert report["version"] == "three"
    assert report["builds"] == report["expected_builds"]
    assert _template_images(name) == []


def test_missing_base_image_is_refused_saying_how_to_load_one(
    e2b_server: Server, tmp_path: Path, templates: list[str]
) -> None:
    """A FROM naming an image that is not on the host fails Template.build with a message naming the image and how
    to load one; nothing is pulled, built or left behind."""
    name = new_name(templates)
    missing = f"corral-test-absent/{uuid.uuid4().hex[:8]}:none"
    report = run_user_script(
        e2b_server,
        tmp_path,
        f"""
        import json
        from e2b import BuildException, Template

        try:
            Template.build(Template().from_image("{missing}").run_cmd("true"), "{name}")
            error = None
        except BuildException as exc:
            error = str(exc)
        print(json.dumps({{"error": error}}))
        """,
    )
    assert report["error"] is not None
    assert missing in report["error"]
    assert "never pulls" in report["error"]
    assert "docker load" in report["error"]
    assert "corral image build" in report["error"]
    assert _docker("images", "-q", missing) == ""
    assert _template_images(name) == []


def test_failing_step_and_a_dockerfile(e2b_server: Server, tmp_path: Path, templates: list[str]) -> None:
    """A run_cmd that exits nonzero fails the build naming the exit code (no image, no container left); a
    Dockerfile's FROM, ENV, RUN and COPY build an image holding what they did."""
    failing, dockerfile = new_name(templates), new_name(templates)
    (tmp_path / "app.txt").write_text("from the dockerfile\n")
    report = run_user_script(
        e2b_server,
        tmp_path,
        f"""
        import json, os
        from e2b import BuildException, Template

        def error_of(template, name):
            try:
                Template.build(template, name)
            except BuildException as exc:
                return str(exc)
            return None

        failed = error_of(Template().from_image(os.environ["BASE_IMAGE"]).run_cmd("echo x; exit 7"), "{failing}")
        dockerfile = (
            "FROM " + os.environ["BASE_IMAGE"] + "\\n"
            "ENV PLACE=docker\\n"
            "RUN echo \\"$PLACE\\" > /tmp/place\\n"
            "COPY app.txt /srv/app/\\n"
        )
        built = error_of(Template().from_dockerfile(dockerfile), "{dockerfile}")
        print(json.dumps({{"failed": failed, "built": built}}))
        """,
    )
    assert report["failed"] is not None
    assert "exited with 7" in report["failed"]
    assert report["built"] is None
    assert _template_images(failing) == []
    image = f"{REPO}/{dockerfile}:default"
    shown = _docker("run", "--rm", "--entrypoint", "/bin/sh", image, "-c", "cat /tmp/place /srv/app/app.txt")
    assert shown.splitlines() == ["docker", "from the dockerfile"]


def test_start_and_ready_commands_run_when_a_sandbox_starts(
    e2b_server: Server, tmp_path: Path, templates: list[str]
) -> None:
    """set_start_cmd's command runs in each new sandbox (as ``user``, with the sandbox's envs, outliving the create)
    and Sandbox.create returns once the ready command succeeds."""
    name = new_name(templates)
    report = run_user_script(
        e2b_server,
        tmp_path,
        f"""
        import json, os
        from e2b import Sandbox, Template, wait_for_file

        start = 'echo "started-$GREETING-$(whoami)" > ~/started; sleep 1; touch ~/ready; exec sleep 100000'
        ready = wait_for_file("/home/user/ready")
        template = Template().from_image(os.environ["BASE_IMAGE"]).set_start_cmd(start, ready)
        Template.build(template, "{name}")
        sandbox = Sandbox.create("{name}", envs={{"GREETING": "hi"}})
        try:
            seen = sandbox.commands.run(
                "ls /home/user/ready && cat /home/user/started"
                " && kill -0 $(cat /home/user/.corral-start.log.pid) && echo running"
            ).stdout
        finally:
            sandbox.kill()
        print(json.dumps({{"seen": seen}}))
        """,
    )
    assert report["seen"].splitlines() == ["/home/user/ready", "started-hi-user", "running"]


def test_async_build_in_background_with_status_polling(
    e2b_server: Server, tmp_path: Path, templates: list[str]
) -> None:
    """AsyncTemplate.build_in_background answers at once; get_build_status polled with log offsets reaches ready,
    and every log line comes once."""
    name = new_name(templates)
    report = run_user_script(
        e2b_server,
        tmp_path,
        f"""
        import asyncio, json, os, time
        from e2b import AsyncTemplate

        async def main():
            template = AsyncTemplate().from_image(os.environ["BASE_IMAGE"])
            template = template.run_cmd("for i in 1 2 3; do echo line-$i; done")
            info = await AsyncTemplate.build_in_background(template, "{name}")
            offset, lines, status = 0, [], None
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                answer = await AsyncTemplate.get_build_status(info, logs_offset=offset)
                offset += len(answer.log_entries)
                lines += [entry.message for entry in answer.log_entries]
                status = answer.status.value
                if status in ("ready", "error") and not answer.log_entries:
                    break
                await asyncio.sleep(0.2)
            return {{"status": status, "lines": lines, "exists": await AsyncTemplate.exists("{name}")}}

        print(json.dumps(asyncio.run(main())))
        """,
    )
    assert report["status"] == "ready"
    assert [line for line in report["lines"] if line.startswith("line-")] == ["line-1", "line-2", "line-3"]
    assert report["exists"] is True


def test_build_steps_cannot_reach_other_containers_on_the_bridge(
    e2b_server: Server, tmp_path: Path, templates: list[str]
) -> None:
    """A build step, like a workspace, is kept from its bridge neighbours (CORRAL_EGRESS_ALWAYS_DENY): fetching a
    container this test started fails the build, though the container answers from the host."""
    name = new_name(templates)
    target = f"corral-test-build-target-{uuid.uuid4().hex[:8]}"
    subprocess.run(
        ["docker", "run", "-d", "--rm", "--name", target, "--cap-drop", "ALL", BASE_IMAGE, "python3", "-m",
         "http.server", "8080"],
        check=True, capture_output=True,
    )  # fmt: skip
    try:
        address = _docker("inspect", "-f", "{{.NetworkSettings.IPAddress}}", target)
        report = run_user_script(
            e2b_server,
            tmp_path,
            f"""
            import json
            from e2b import BuildException, Template

            try:
                Template.build(Template().from_template("base").run_cmd("curl -sS --max-time 5 http://{address}:8080/"),
                               "{name}")
                error = None
            except BuildException as exc:
                error = str(exc)
            print(json.dumps({{"error": error}}))
            """,
        )
    finally:
        subprocess.run(["docker", "rm", "-f", target], capture_output=True, check=False)
    assert report["error"] is not None, report
    assert _template_images(name) == []
