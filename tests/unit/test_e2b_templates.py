"""Parsing and validation of the E2B template build API, the rewrite of a copy step's archive, and build logs."""

from __future__ import annotations

import asyncio
import io
import tarfile
from pathlib import Path
from typing import Any

import pytest

from corral.api.e2b.templates import (
    MAX_LOG_ENTRIES,
    Build,
    BuildSpec,
    Step,
    TemplateRef,
    TemplatesState,
    parse_build_start,
    parse_tags,
    parse_template_name,
    rewrite_copy_archive,
)
from corral.errors import InvalidRequestError

HASH = "a" * 64


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("my-template", TemplateRef("my-template", "default")),
        ("my-template:v1.2", TemplateRef("my-template", "v1.2")),
        ("a.b_c__d--e", TemplateRef("a.b_c__d--e", "default")),
        ("x9:Stable_1", TemplateRef("x9", "Stable_1")),
    ],
)
def test_template_names_parse_to_name_and_tag(value: str, expected: TemplateRef) -> None:
    """``name`` and ``name:tag`` parse to the template and tag (``default`` when none is given)."""
    assert parse_template_name(value) == expected
    assert expected.image == f"corral-templates/{expected.name}:{expected.tag}"


@pytest.mark.parametrize(
    "value", ["", "My-Template", "-lead", "trail-", "a..b", "a___b", "has space", "a/b", "x" * 65, "ok:.bad", "ok:"]
)
def test_invalid_template_names_are_refused_saying_the_rule(value: str) -> None:
    """A name Docker could not hold as a repository (or a bad tag) is refused with the rule in the message."""
    with pytest.raises(InvalidRequestError, match=r"invalid|required"):
        parse_template_name(value)


def test_non_string_name_is_refused() -> None:
    """A missing or non-string name is refused, naming the field."""
    with pytest.raises(InvalidRequestError, match=r"^alias: a template name is required"):
        parse_template_name(None, field_name="alias")


def test_tags_are_validated_and_deduplicated() -> None:
    """Tags keep their order without duplicates; a bad tag or a non-list is refused."""
    assert parse_tags(["v1", "stable", "v1"]) == ["v1", "stable"]
    with pytest.raises(InvalidRequestError, match="tag '-x' is invalid"):
        parse_tags(["ok", "-x"])
    with pytest.raises(InvalidRequestError, match="must be a list of tag strings"):
        parse_tags("v1")


def _body(**extra: Any) -> dict[str, Any]:
    return {"fromImage": "corral/workspace:base", "steps": [], "force": False, **extra}


def test_build_start_parses_every_step_type() -> None:
    """RUN, COPY (padded to src, dest, owner, mode), ENV, WORKDIR and USER steps parse into values."""
    spec = parse_build_start(
        _body(
            steps=[
                {"type": "RUN", "args": ["echo hi", "root"], "force": False},
                {"type": "COPY", "args": ["a.txt", "/app/"], "filesHash": HASH},
                {"type": "ENV", "args": ["A", "1", "B", "2"]},
                {"type": "WORKDIR", "args": ["/app"]},
                {"type": "USER", "args": ["user"]},
            ]
        )
    )
    assert spec.from_image == "corral/workspace:base"
    assert spec.from_template is None
    assert (spec.start_cmd, spec.ready_cmd) == (None, None)
    assert spec.steps == (
        Step("RUN", ("echo hi", "root")),
        Step("COPY", ("a.txt", "/app/", "", ""), HASH),
        Step("ENV", ("A", "1", "B", "2")),
        Step("WORKDIR", ("/app",)),
        Step("USER", ("user",)),
    )


def test_build_start_keeps_start_and_ready_commands() -> None:
    """set_start_cmd's start and ready commands are kept for sandboxes of the template to run."""
    spec = parse_build_start(_body(fromImage=None, fromTemplate="base", startCmd="npm start", readyCmd="sleep 1"))
    assert (spec.from_template, spec.start_cmd, spec.ready_cmd) == ("base", "npm start", "sleep 1")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (_body(fromImageRegistry={"type": "aws"}), "never pulls from a registry"),
        (_body(startCmd=["npm", "start"]), r"^startCmd: must be a shell command"),
        (_body(readyCmd="x" * 20_000), r"^readyCmd: must be a shell command of at most 16384 characters"),
        (_body(fromTemplate="base"), "exactly one base"),
        ({"steps": []}, "exactly one base"),
        (_body(fromImage=""), "fromImage: must be a non-empty string"),
        (_body(steps={"type": "RUN"}), "steps: must be a list"),
        (_body(steps=[{"type": "ADD", "args": ["x"]}]), r"steps\[0\].type: 'ADD' is not a step type; allowed: RUN"),
        (_body(steps=[{"type": "RUN", "args": []}]), r"steps\[0\]: a RUN step takes 1 to 2 arguments, got 0"),
        (_body(steps=[{"type": "ENV", "args": ["A"]}]), "name/value pairs"),
        (_body(steps=[{"type": "ENV", "args": ["1A", "x"]}]), "not an environment variable name"),
        (_body(steps=[{"type": "COPY", "args": ["a", "/b"]}]), "needs the 64-hex-digit hash"),
        (_body(steps=[{"type": "COPY", "args": ["a", "/b", "", "999"], "filesHash": HASH}]), "not an octal"),
        (_body(steps=[{"type": "COPY", "args": ["a", "/b", "a:b:c", ""], "filesHash": HASH}]), "'user:group'"),
        (_body(steps=[{"type": "USER", "args": ["bad user"]}]), "is not a user name"),
        (_body(steps=[{"type": "RUN", "args": ["true", "$(id)"]}]), "is not a user name"),
        (_body(steps=[{"type": "WORKDIR", "args": [""]}]), "WORKDIR needs a path"),
        (_body(steps=["RUN true"]), "must be an object"),
    ],
)
def test_build_start_refuses_what_corral_cannot_build(body: dict[str, Any], message: str) -> None:
    """Registries, malformed start commands, ambiguous bases and malformed steps are refused with a message saying
    why."""
    with pytest.raises(InvalidRequestError, match=message):
        parse_build_start(body)


# --- the copy archive --------------------------------------------------------------------------------------------


def _archive(path: Path, entries: dict[str, bytes | None], *, gzip: bool = True) -> Path:
    """A tar as the SDK makes it: paths relative to the context, a None value being a directory."""
    with tarfile.open(path, "w:gz" if gzip else "w") as tar:
        for name, data in entries.items():
            info = tarfile.TarInfo(name)
            if data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
    return path


def _rewrite(tmp_path: Path, entries: dict[str, bytes | None], dest: str, **options: Any) -> dict[str, Any]:
    out = tmp_path / "out.tar"
    options = {"into_dir": False, "uid": 1000, "gid": 1000, "mode": None, **options}
    rewrite_copy_archive(_archive(tmp_path / "in.tar", entries), out, dest, **options)
    with tarfile.open(out) as tar:
        return {m.name: (m.uid, m.gid, oct(m.mode)) for m in tar.getmembers()}


def test_copy_of_a_file_to_a_directory_keeps_its_name(tmp_path: Path) -> None:
    """A file copied into a directory (a trailing slash or an existing one) lands under its base name."""
    assert _rewrite(tmp_path, {"sub/hello.txt": b"hi"}, "/home/user", into_dir=True) == {
        "home/user/hello.txt": (1000, 1000, "0o644")
    }


def test_copy_of_a_file_to_a_path_renames_it(tmp_path: Path) -> None:
    """A single file copied to a path that is no directory becomes that path."""
    assert list(_rewrite(tmp_path, {"hello.txt": b"hi"}, "/etc/greeting")) == ["etc/greeting"]


def test_copy_of_a_directory_copies_its_contents_with_owner_and_mode(tmp_path: Path) -> None:
    """A directory's contents go into the destination (the directory itself becomes it), owned and moded as asked."""
    entries = {"data": None, "data/a.txt": b"a", "data/nested": None, "data/nested/b.txt": b"b"}
    assert _rewrite(tmp_path, entries, "/opt/data", uid=0, gid=50, mode=0o750) == {
        "opt/data": (0, 50, "0o750"),
        "opt/data/a.txt": (0, 50, "0o750"),
        "opt/data/nested": (0, 50, "0o750"),
        "opt/data/nested/b.txt": (0, 50, "0o750"),
    }


def test_copy_of_several_files_goes_into_the_destination(tmp_path: Path) -> None:
    """Several sources (a glob's matches) land under their base names in the destination."""
    result = _rewrite(tmp_path, {"a.py": b"1", "b.py": b"2"}, "/app")
    assert sorted(result) == ["app/a.py", "app/b.py"]


def test_copy_archive_keeps_file_contents_and_reads_plain_tar(tmp_path: Path) -> None:
    """An uncompressed archive (the SDK's gzip=False) is read too, and file contents pass through unchanged."""
    source = _archive(tmp_path / "plain.tar", {"f.txt": b"payload"}, gzip=False)
    out = tmp_path / "out.tar"
    assert rewrite_copy_archive(source, out, "/x/f.txt", into_dir=False, uid=0, gid=0, mode=None) == 1
    with tarfile.open(out) as tar:
        member = tar.extractfile("x/f.txt")
        assert member is not None
        assert member.read() == b"payload"


@pytest.mark.parametrize(("entries", "message"), [({"../escape": b"x"}, "outside the build context"), ({}, "empty")])
def test_copy_archive_refuses_escapes_and_empty_archives(
    tmp_path: Path, entries: dict[str, bytes | None], message: str
) -> None:
    """An entry outside the context, or an archive with nothing in it, fails the copy with a clear message."""
    with pytest.raises(InvalidRequestError, match=message):
        _rewrite(tmp_path, entries, "/dest")


def test_copy_archive_refuses_what_is_not_a_tar(tmp_path: Path) -> None:
    """Bytes that are no tar archive fail the copy saying so."""
    bogus = tmp_path / "bogus.tar"
    bogus.write_bytes(b"not a tar at all" * 100)
    with pytest.raises(InvalidRequestError, match="not a readable tar file"):
        rewrite_copy_archive(bogus, tmp_path / "out.tar", "/d", into_dir=False, uid=0, gid=0, mode=None)


# --- build logs --------------------------------------------------------------------------------------------------


def test_build_log_is_bounded_and_offsets_stay_absolute() -> None:
    """Past MAX_LOG_ENTRIES the oldest entries go, and an offset still names the same entry."""
    build = Build(TemplateRef("t"), "b", ["default"])
    for i in range(MAX_LOG_ENTRIES + 10):
        build.log(f"line {i}")
    assert len(build.entries) == MAX_LOG_ENTRIES
    assert build.dropped == 10
    assert [e["message"] for e in build.page(MAX_LOG_ENTRIES + 8, 100, None)] == [
        f"line {MAX_LOG_ENTRIES + 8}",
        f"line {MAX_LOG_ENTRIES + 9}",
    ]
    assert build.page(0, 1, None)[0]["message"] == "line 10"  # dropped entries are gone, not repeated


def test_build_output_is_logged_by_line_and_errors_filter_by_level() -> None:
    """Output split across chunks is logged a line at a time; fail() records the reason; level filters the page."""
    build = Build(TemplateRef("t"), "b", ["default"])
    build.output(b"one\ntw", "1")
    build.output(b"o\nthree", "1")
    build.flush("1")
    build.fail("step 1: boom", "1")
    assert [e["message"] for e in build.page(0, 100, None)] == ["one", "two", "three", "step 1: boom"]
    assert [e["message"] for e in build.page(0, 100, "error")] == ["step 1: boom"]
    assert build.status == "error"
    assert build.reason is not None
    assert build.reason["step"] == "1"


# --- the base of a build ------------------------------------------------------------------------------------------


class _Engine:
    """A Docker engine holding only the images given (what resolve_base asks of it)."""

    def __init__(self, images: dict[str, str]) -> None:
        self.images = images

    async def inspect_image(self, name: str) -> dict[str, Any] | None:
        return {"Id": self.images[name]} if name in self.images else None


def _resolve(spec: BuildSpec, images: dict[str, str]) -> str:
    state = TemplatesState(_Engine(images), Path("/nonexistent"), "corral/workspace:base", owner="o")  # type: ignore[arg-type]
    return asyncio.run(state.resolve_base(spec))


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (BuildSpec("corral/workspace:base", None, ()), "sha256:base"),
        (BuildSpec("e2bdev/base", None, ()), "sha256:base"),  # E2B's base is Corral's when no such image is here
        (BuildSpec(None, "base", ()), "sha256:base"),
        (BuildSpec(None, "mine:v1", ()), "sha256:mine"),
    ],
)
def test_a_build_starts_from_an_image_on_the_host(spec: BuildSpec, expected: str) -> None:
    """fromImage names a local image (E2B's base maps to Corral's), fromTemplate a template built here or ``base``."""
    images = {"corral/workspace:base": "sha256:base", "corral-templates/mine:v1": "sha256:mine"}
    assert _resolve(spec, images) == expected


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (BuildSpec("python:3", None, ()), r"image 'python:3' is not present on this host.*docker load.*corral image"),
        (BuildSpec(None, "absent", ()), r"template 'absent' does not exist on this server"),
    ],
)
def test_a_missing_base_is_refused_saying_how_to_get_one(spec: BuildSpec, message: str) -> None:
    """A base that is not on the host fails with the image's name and how to load or build one (nothing is pulled)."""
    with pytest.raises(InvalidRequestError, match=message):
        _resolve(spec, {"corral/workspace:base": "sha256:base"})
