"""README.md's examples, run as printed in a fresh shell against a real ``corral serve``, and every fenced block
accounted for.

A fenced block marked ``bash`` is runnable: each runs in its own fresh shell (``env -i``: only ``HOME``,
``PATH=/usr/bin:/bin`` and, standing in for ``make run``'s defaults, the test server's ``CORRAL_URL`` and
``CORRAL_DATA_DIR``) from the repository's root, after the README's one-line setup (the ``bash`` block holding
``corral env``), under ``bash -e -o pipefail``; what it prints is checked against what its comments say, and it
must leave no workspace and no agent type behind (so it runs again). The MCP section's block runs in a directory
holding that section's ``python`` block as ``mcp_client.py``, as the README says. Every other block is either run
by a named test (the SDK's ``python`` blocks by test_sdk.py, ``make start``/``make stop`` below), interactive
(``console``: the README names the test that drives it), or in a short explicit list of blocks that are not
commands; a new block that is none of these fails :func:`test_every_readme_block_is_run_or_accounted_for`. The
server generates its own token, as ``make run`` does, so the examples must find it the way a user's shell would.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import Server, free_port, start_server, stop_server

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BIN = Path(sys.executable).parent
EXAMPLES = Path(__file__).parent / "examples"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
HEADING = re.compile(r"^#{2,3} (.+)$", re.MULTILINE)
TEST_FILE = re.compile(r"tests/e2e/(test_\w+\.py)")
API_ERROR = re.compile(r'\{"error": ?\{"code"')  # Corral's error body (curl prints it and exits 0)


@dataclass(frozen=True, slots=True)
class Block:
    """One fenced block of the README, with the prose between the previous block (or heading) and it."""

    language: str
    text: str
    line: int
    section: str
    before: str

    @property
    def name(self) -> str:
        """An id for the test report: the line and the section."""
        slug = re.sub(r"[^a-z0-9]+", "-", self.section.lower()).strip("-")[:40]
        return f"line{self.line}-{slug}"


def readme_blocks() -> list[Block]:
    """Every fenced block of README.md, with its language, first line, section and the prose before it."""
    text = README.read_text()
    blocks = []
    previous_end = 0
    for match in FENCE.finditer(text):
        headings = list(HEADING.finditer(text, 0, match.start()))
        line = text.count("\n", 0, match.start()) + 1
        since = max(previous_end, headings[-1].end() if headings else 0)
        section = headings[-1].group(1) if headings else ""
        blocks.append(Block(match.group(1), match.group(2), line, section, text[since : match.start()]))
        previous_end = match.end()
    return blocks


BLOCKS = readme_blocks()
RUNNABLE = [b for b in BLOCKS if b.language == "bash"]
SETUP = next((b for b in RUNNABLE if "corral env" in b.text), None)
MCP_SECTION = "MCP"  # its bash block runs `python mcp_client.py`: the section's python block, saved under that name

# What each section's bash block prints, in order (regular expressions searched one after the other in stdout):
# the values its comments promise. A new bash block needs an entry, so its output is checked, not only its exit code.
EXPECTED: dict[str, list[str]] = {
    "A fresh shell, and the server in the background": [r"(?m)^gvisor +healthy"],
    "A first workspace": [r'"exit_code":3', r'"stdout":"Linux ws-[0-9a-f]+ ', r'"path":"/workspace/docs/README.md"'],
    "Streamed exec and stdin": [
        r'(?m)^\{"stream":"stdout","data":"first\\n"\}$',
        r'(?m)^\{"stream":"stdout","data":"typed\\n"\}$',
        r'(?m)^\{"stream":"stderr","data":"oops\\n"\}$',
        r'(?m)^\{"exit_code":0,"timed_out":false,"duration_ms":',
    ],
    "Stateful workspaces: stop, pause, snapshots, forks": [
        r'"status":"paused"',
        r'"pause":"memory"',
        r'"status":"ready"',
        *[r"\d+ sleep 600"] * 4,
    ],
    "Agent types, sessions and tools": [
        r"(?m)^session active$",
        r'(?m)^\{"exit_code":0,"stdout":"[0-9a-f]{7,} first commit\\n",.*\}$',
        r"(?m)^ended$",
        r"(?m)^204$",
    ],
    "The E2B SDK on Corral": [r"(?m)^hello from \S+", r"(?m)^hi$"],
    "The `corral` command": [
        r"(?m)^hello from Linux\nexit code: 3\n\.\n\.\.\nTYPED\nsame files\n(\w+) stopped\n\1 ready\n\1\n",
        r"(?m)^hi from /tmp\n# notes\nrefused: exit code 1\n",
        r"(?m)^AT +TOOL +STATUS",
        r"(?m) bash +ok.*\n.* bash +ok.*\n.* read +ok.*\n.* write +refused",
        r"(?m)^ID +AGENT TYPE +STATUS",
        r"(?m)^(\w+) +reviewer +active +\w+",
        r"(?m)^kept: its session is active$",
        r"(?m)^\w+ ended\n\w+\n?$",
    ],
    MCP_SECTION: [r"(?m)^\['bash', 'read'\]\nhi\nTrue Tool 'write' is not enabled for this agent type\n\w+\n\Z"],
}
EXPECTED_STDERR: dict[str, list[str]] = {
    "The `corral` command": [
        r"error: tool_not_allowed: Tool 'write' is not enabled for this agent type\n",
        r"error: agent_type_in_use: .*[0-9a-f]{16,}",  # names the live session
    ],
}

# Blocks that are not commands, each found by its language and first line: (language, first line, what it is).
NOT_COMMANDS = [
    ("sh", "make run    # ", "the two commands themselves: `make test` runs this suite, `make run` is its server"),
    ("", "firecracker  unhealthy  KVM not available", "output of GET .../providers"),
    ("json", '{"agent_type_id": "<id>", "task"', "a request body with placeholders"),
    ("json", '{"mcpServers": {"corral": {', "an MCP client's configuration file"),
    ("", "api/ (HTTP, E2B)   cli/", "the architecture diagram"),
    ("", "src/corral/", "the source layout"),
]
# Blocks another test runs as printed: (language, first line, the test).
RUN_ELSEWHERE = [
    ("sh", "make start   # ", "tests/e2e/test_readme.py::test_make_start_and_stop_are_idempotent"),
]


def _first_line(block: Block) -> str:
    return block.text.splitlines()[0] if block.text else ""


def _listed(block: Block, entries: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    return [e for e in entries if block.language == e[0] and _first_line(block).startswith(e[1])]


def how_it_runs(block: Block) -> str:
    """What runs the block, or what it is when nothing runs it; ``""`` for a block nothing accounts for."""
    found = _listed(block, NOT_COMMANDS) + _listed(block, RUN_ELSEWHERE)
    if block.language == "bash":
        return "" if found else "tests/e2e/test_readme.py (fresh shell)"
    if found:
        return found[0][2]
    if block.language == "python" and block.section == MCP_SECTION:
        return "tests/e2e/test_readme.py, as mcp_client.py under the MCP bash block"
    if block.language == "python":
        for example in sorted(EXAMPLES.glob("*.py")):
            if example.read_text() == block.text and example.name in (ROOT / "tests/e2e/test_sdk.py").read_text():
                return f"tests/e2e/test_sdk.py (tests/e2e/examples/{example.name})"
    if block.language == "console":
        named = [m for m in TEST_FILE.findall(block.before) if (ROOT / "tests" / "e2e" / m).exists()]
        if named:
            return f"interactive; tests/e2e/{named[-1]}"
    return ""


def fresh_shell(
    script: str, server: Server, home: Path, *, cwd: Path = ROOT, data_dir: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` with ``bash -e -o pipefail`` in an environment holding nothing but HOME, a minimal PATH and
    where the server is (``CORRAL_URL``, and ``CORRAL_DATA_DIR`` unless told not to)."""
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "CORRAL_URL": server.url}
    if data_dir:
        env["CORRAL_DATA_DIR"] = str(server.data_dir)
    return subprocess.run(["env", "-i", *(f"{k}={v}" for k, v in env.items()), "bash", "-e", "-o", "pipefail", "-c",
                           script], cwd=cwd, capture_output=True, text=True, timeout=280, check=False)  # fmt: skip


@pytest.fixture(scope="module")
def readme_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server that generated its own token into its data directory, as ``make run`` does."""
    if subprocess.run(["docker", "version"], capture_output=True, check=False).returncode != 0:
        pytest.skip("Docker engine not reachable; run `make bootstrap`")
    server = start_server(tmp_path_factory.mktemp("corral-readme"), {"CORRAL_API_TOKEN": ""})
    token = (server.data_dir / "api-token").read_text().strip()
    server.client.headers["Authorization"] = f"Bearer {token}"
    yield server
    stop_server(server)


def test_readme_marks_the_one_line_setup_and_runnable_blocks() -> None:
    """The README has its one-line setup as a runnable block, and more runnable examples after it."""
    assert SETUP is not None, "README.md has no ```bash block running `corral env`"
    assert SETUP.text.splitlines()[0] == 'eval "$(.venv/bin/corral env)"'
    assert len(RUNNABLE) >= 4 and RUNNABLE[0] == SETUP


def test_every_readme_block_is_run_or_accounted_for() -> None:
    """Every fenced block is run here, run by a named test, an interactive ``console`` block whose prose names the
    test that drives it, or one of the few listed non-command blocks; every runnable block has its expected output,
    and no list entry is stale."""
    unaccounted = [f"line {b.line} ({b.language or 'no language'}, {b.section})" for b in BLOCKS if not how_it_runs(b)]
    assert not unaccounted, (
        f"README blocks nothing runs: {unaccounted}. Make it a ```bash block (and give EXPECTED its output), a "
        "```console block right after a sentence naming the test that drives it, or list it in NOT_COMMANDS"
    )
    for language, first, what in NOT_COMMANDS + RUN_ELSEWHERE:
        matching = [b for b in BLOCKS if b.language == language and _first_line(b).startswith(first)]
        assert len(matching) == 1, f"{what}: {len(matching)} README blocks start with {first!r}"
    sections = [b.section for b in RUNNABLE if b is not SETUP] + ([SETUP.section] if SETUP else [])
    assert sorted(sections) == sorted(set(sections)) and set(sections) == set(EXPECTED), (
        "each section holds at most one bash block, and EXPECTED names exactly their sections"
    )


def _leftovers(server: Server) -> tuple[list[str], list[str]]:
    workspaces = [w["id"] for w in server.client.get("/api/v1/agent/workspaces").json()["workspaces"]]
    types = [t["name"] for t in server.client.get("/api/v1/agent-types").json()["agent_types"]]
    return workspaces, types


def _in_order(patterns: list[str], text: str) -> str | None:
    """The first pattern not found after the previous one's match, or None when all are, in order."""
    position = 0
    for pattern in patterns:
        match = re.compile(pattern).search(text, position)
        if match is None:
            return pattern
        position = match.end()
    return None


@pytest.mark.parametrize("block", RUNNABLE, ids=[b.name for b in RUNNABLE])
def test_readme_block_runs_as_printed_in_a_fresh_shell(block: Block, readme_server: Server, tmp_path: Path) -> None:
    """The block, after the one-line setup, exits 0 in a fresh shell, prints what its comments say and no error
    from the API or a program, and leaves no workspace or agent type behind."""
    assert SETUP is not None
    script = block.text if block is SETUP else f"{SETUP.text}\n{block.text}"
    if block.section == MCP_SECTION:  # "save this as mcp_client.py, then run it from the same directory"
        [client] = [b for b in BLOCKS if b.section == MCP_SECTION and b.language == "python"]
        workdir = tmp_path / "mcp-example"
        workdir.mkdir()
        (workdir / "mcp_client.py").write_text(client.text)
        script = f"{SETUP.text}\ncd {workdir}\n{block.text}"
    proc = fresh_shell(script, readme_server, tmp_path)
    report = f"README.md line {block.line} ({block.section}):\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.returncode == 0, report
    assert API_ERROR.search(proc.stdout) is None, report
    for sign in ("Traceback", "command not found", "KeyError", "No such file"):
        assert sign not in proc.stderr, report
    missing = _in_order(EXPECTED.get(block.section, [r"\A(?!)"]), proc.stdout)
    assert missing is None, f"stdout lacks {missing!r}\n{report}"
    missing = _in_order(EXPECTED_STDERR.get(block.section, []), proc.stderr)
    assert missing is None, f"stderr lacks {missing!r}\n{report}"
    deadline = time.monotonic() + 30  # a session's workspace is destroyed in the background once it ends
    while (left := _leftovers(readme_server)) != ([], []) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == ([], []), f"the block left (workspaces, agent types) {left} behind\n{report}"


def test_corral_env_sets_path_url_data_dir_and_token(readme_server: Server, tmp_path: Path) -> None:
    """After the one line, ``corral`` is on PATH and the URL, the absolute data directory and the server's generated
    token are exported, so even a program started elsewhere reaches the server (here: E2B_API_KEY is not empty)."""
    token = (readme_server.data_dir / "api-token").read_text().strip()
    script = 'eval "$(.venv/bin/corral env)"\neval "$(.venv/bin/corral env)"\n' + (
        'echo "$PATH"; command -v corral; echo "$CORRAL_URL"; echo "$CORRAL_DATA_DIR"; '
        'export E2B_API_KEY=$CORRAL_API_TOKEN; echo "$E2B_API_KEY"'
    )
    proc = fresh_shell(script, readme_server, tmp_path)
    assert proc.returncode == 0, proc.stderr
    path, corral, url, data_dir, key = proc.stdout.splitlines()
    assert path == f"{BIN}:/usr/bin:/bin", "PATH gained the venv once, however often the line runs"
    assert (corral, url, data_dir, key) == (str(BIN / "corral"), readme_server.url, str(readme_server.data_dir), token)


def test_sdk_finds_the_token_through_corral_data_dir_from_any_directory(readme_server: Server, tmp_path: Path) -> None:
    """From a directory outside the repository the SDK reads the token from ``CORRAL_DATA_DIR``; without it, its
    first call says which token it looked for and how to give one."""
    program = (
        f"{BIN / 'python'} -c 'from corral.client import Corral\n"
        "try:\n    print(len(Corral().workspaces.list()))\n"
        "except Exception as exc:\n    print(type(exc).__name__, exc)'"
    )
    found = fresh_shell(program, readme_server, tmp_path, cwd=tmp_path)
    assert found.returncode == 0 and found.stdout.strip().isdigit(), found.stdout + found.stderr
    missing = fresh_shell(program, readme_server, tmp_path, cwd=tmp_path, data_dir=False)
    assert missing.stdout.startswith("AuthenticationError no API token: CORRAL_API_TOKEN is not set and "), missing
    assert f"{tmp_path}/data/api-token does not exist" in missing.stdout
    assert "set CORRAL_DATA_DIR to the server's data directory" in missing.stdout


def test_make_start_and_stop_are_idempotent(tmp_path: Path) -> None:
    """The README's ``make start`` / ``make stop`` block, run as printed in a fresh shell (``make bootstrap``, which
    both depend on and ``make test`` has just run, is skipped), prints what its comments say; ``scripts/server.sh``
    keeps the pid and log in the data directory, answers a second start and a second stop without error, and
    stops the server."""
    [block] = [b for b in BLOCKS if b.language == "sh" and _first_line(b).startswith("make start")]
    url = f"http://127.0.0.1:{free_port()}"
    data_dir = tmp_path / "data"
    env = {**os.environ, "CORRAL_URL": url, "CORRAL_DATA_DIR": str(data_dir), "CORRAL_WARM_POOL_SIZE": "0",
           "CORRAL_E2B_WARM_POOL_SIZE": "0", "CORRAL_PROVIDERS": "gvisor"}  # fmt: skip
    fresh = {k: env[k] for k in ("CORRAL_URL", "CORRAL_DATA_DIR", "CORRAL_WARM_POOL_SIZE", "CORRAL_E2B_WARM_POOL_SIZE",
                                 "CORRAL_PROVIDERS")} | {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}  # fmt: skip

    def script(action: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", "scripts/server.sh", action], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=150, check=False)  # fmt: skip

    def readme_line(line: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["env", "-i", *(f"{k}={v}" for k, v in fresh.items()), "bash", "-e", "-c",
                               "make() { command make -o bootstrap \"$@\"; }\n" + line], cwd=ROOT,
                              capture_output=True, text=True, timeout=150, check=False)  # fmt: skip

    start_line, stop_line = block.text.splitlines()
    pid = 0
    try:
        first = readme_line(start_line)
        log = (data_dir / "corral.log").read_text() if (data_dir / "corral.log").exists() else ""
        assert first.returncode == 0, first.stdout + first.stderr + log
        pid = int((data_dir / "corral.pid").read_text())
        assert (
            f"corral is running (pid {pid}) on {url}; log: {data_dir}/corral.log; stop it with `make stop`"
            in first.stdout
        ), first.stdout
        assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200
        again = script("start")
        assert again.returncode == 0 and f"already running (pid {pid})" in again.stdout
        assert (data_dir / "api-token").exists() and (data_dir / "corral.log").stat().st_mode & 0o077 == 0
    finally:
        stopped = readme_line(stop_line)
    assert stopped.returncode == 0 and f"corral stopped (pid {pid})" in stopped.stdout, stopped.stderr
    assert not Path(f"/proc/{pid}").exists() or b"corral" not in Path(f"/proc/{pid}/cmdline").read_bytes()
    assert not (data_dir / "corral.pid").exists()
    second = script("stop")
    assert second.returncode == 0 and second.stdout.strip() == "corral is not running"
