"""The ``corral`` command: the server (``serve``), images, and a client for everything the HTTP API offers.

Client commands talk to ``CORRAL_URL`` (default ``http://127.0.0.1:8000``) with ``CORRAL_API_TOKEN`` through the
synchronous SDK (:class:`corral.client.Corral`). An error the server reports is printed as one line,
``error: <code>: <message>``, with exit code 1; nothing a user sees is ever a traceback.
"""

from __future__ import annotations

import json
import logging
import shlex
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

if TYPE_CHECKING:
    from rich.console import Console

    from corral.client import Corral, SessionInfo, WorkspaceInfo

__all__ = ["app", "main"]

app = typer.Typer(help="Corral: isolated workspaces for AI agents.", no_args_is_help=True, add_completion=False)
image_app = typer.Typer(help="Workspace images.", no_args_is_help=True)
app.add_typer(image_app, name="image")
workspaces_app = typer.Typer(help="Create, run commands in, stop, resume and remove workspaces.", no_args_is_help=True)
app.add_typer(workspaces_app, name="workspaces")
agent_types_app = typer.Typer(help="Declare agent types and their workspace configuration.", no_args_is_help=True)
app.add_typer(agent_types_app, name="agent-types")
sessions_app = typer.Typer(help="Start agent sessions, call their tools, end them.", no_args_is_help=True)
app.add_typer(sessions_app, name="sessions")

JsonFlag = Annotated[bool, typer.Option("--json", help="print the API's JSON instead of a table (for scripts)")]
MAIN_ARGUMENT = {"bash": "command", "read": "path", "write": "path", "edit": "path", "grep": "pattern",
                 "glob": "pattern", "git": "args"}  # fmt: skip
"""The argument a tool's bare positional value fills (``sessions tool ID bash 'ls'``)."""


# --- plumbing ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Remote:
    """Where the client commands send their requests (from ``--url`` / ``--token`` or the environment)."""

    url: str | None
    token: str | None


@app.callback()
def options(
    ctx: typer.Context,
    *,
    url: Annotated[
        str | None,
        typer.Option("--url", envvar="CORRAL_URL", help="the Corral server  \\[default: http://127.0.0.1:8000]"),
    ] = None,
    token: Annotated[str | None, typer.Option("--token", envvar="CORRAL_API_TOKEN", help="the API token")] = None,
) -> None:
    """Corral: isolated workspaces for AI agents."""
    ctx.obj = Remote(url, token)


def _stderr() -> Console:
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def _show(renderable: Any) -> None:
    """Print a table (or text) on stdout; piped into another program, rows stay whole lines, never wrapped."""
    from rich.console import Console

    if sys.stdout.isatty():
        Console(highlight=False).print(renderable)
        return
    console = Console(highlight=False, width=10_000, no_color=True)
    with console.capture() as capture:
        console.print(renderable)
    for line in capture.get().splitlines():
        typer.echo(line.rstrip())


def _fail(code: str, message: str) -> NoReturn:
    """Print ``error: code: message`` as one line on stderr and exit 1."""
    line = " ".join(f"error: {code}: {message}".split())
    typer.echo(line, err=True)
    raise typer.Exit(1)


@contextmanager
def _corral(ctx: typer.Context) -> Iterator[Corral]:
    """A connected SDK client; every Corral error (or timeout) becomes one line and exit code 1."""
    from corral.client import Corral
    from corral.errors import CorralError

    remote: Remote = ctx.obj if isinstance(ctx.obj, Remote) else Remote(None, None)
    try:
        with Corral(remote.url, remote.token) as corral:
            yield corral
    except CorralError as exc:
        _fail(exc.code, exc.message)
    except TimeoutError as exc:
        _fail("timeout", str(exc))


def _print_json(data: object) -> None:
    typer.echo(json.dumps(data, indent=2, default=str))


def _parse_json_object(text: str, what: str) -> dict[str, Any]:
    """A JSON object given inline, as ``@file``, or as ``-`` (stdin)."""
    if text == "-":
        text = sys.stdin.read()
    elif text.startswith("@"):
        try:
            text = Path(text[1:]).read_text()
        except OSError as exc:
            raise typer.BadParameter(f"{what}: cannot read {text[1:]}: {exc.strerror}") from exc
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(f"{what}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from exc
    if not isinstance(value, dict):
        raise typer.BadParameter(f"{what}: must be a JSON object, got {type(value).__name__}")
    return value


def parse_tool_arguments(tool: str, value: str | None, pairs: Sequence[str]) -> dict[str, Any]:
    """A tool's JSON arguments from the positional value and ``--arg`` pairs.

    ``value`` is a JSON object (``'{"path": "a.txt"}'``), ``@file``, ``-`` (stdin), or any other text, which fills
    the tool's main argument (bash's ``command``, read's ``path``...; git's ``args`` are split like a shell would).
    Each pair is ``key=text`` (always a string) or ``key:=json`` (a number, boolean, list or object), so
    ``-a timeout_s:=30`` is the number 30. Pairs override the positional value.
    """
    arguments: dict[str, Any] = {}
    if value is not None:
        if value == "-" or value.startswith(("{", "@")):
            arguments.update(_parse_json_object(value, "arguments"))
        elif tool in MAIN_ARGUMENT:
            main = MAIN_ARGUMENT[tool]
            arguments[main] = shlex.split(value) if main == "args" else value
        else:
            raise typer.BadParameter(f"arguments: {tool!r} takes a JSON object or --arg key=value pairs")
    for pair in pairs:
        key, typed, raw = _split_pair(pair)
        if not typed:
            arguments[key] = raw
            continue
        try:
            arguments[key] = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise typer.BadParameter(f"--arg {key}:=...: not valid JSON ({exc.msg})") from exc
    return arguments


def _split_pair(pair: str) -> tuple[str, bool, str]:
    """``key=value`` -> (key, False, value); ``key:=json`` -> (key, True, json)."""
    key, sep, raw = pair.partition("=")
    if not sep or not key or key == ":":
        raise typer.BadParameter(f"--arg {pair!r}: expected key=value or key:=json")
    if key.endswith(":"):
        return key[:-1], True, raw
    return key, False, raw


def _pairs(values: Sequence[str], option: str) -> dict[str, str]:
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"{option} {item!r}: expected KEY=VALUE")
        out[key] = value
    return out


# --- serve and images (unchanged behaviour) ---------------------------------------------------------------------


@app.command()
def serve(
    *,
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to bind")] = 8000,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error")] = "info",
) -> None:
    """Serve the HTTP API (settings come from CORRAL_* environment variables)."""
    import copy

    import uvicorn
    import uvicorn.config

    from corral.api.app import create_app
    from corral.credentials import RedactingFilter
    from corral.settings import Settings

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    # Credentials are masked where messages are made; the filter on every handler is the second line of defence.
    for handler in logging.getLogger().handlers:
        handler.addFilter(RedactingFilter())
    log_config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    log_config["filters"] = {"redact": {"()": RedactingFilter}}
    for handler_config in log_config["handlers"].values():
        handler_config["filters"] = ["redact"]
    settings = Settings()
    application = create_app(settings)
    typer.echo(f"corral: serving on http://{host}:{port} (data in {settings.data_dir.resolve()})", err=True)
    uvicorn.run(
        application,
        host=host,
        port=port,
        log_level=log_level.lower(),
        access_log=False,
        log_config=log_config,
        # h11 caps what an unfinished request head may hold (httptools buffers it whole): an anonymous client cannot
        # make the server hold a 200 MB header. Past the cap the connection is answered 400 and closed.
        http="h11",
        h11_max_incomplete_event_size=MAX_REQUEST_HEAD,
        limit_concurrency=MAX_CONNECTIONS,
    )


MAX_REQUEST_HEAD = 64 * 1024
"""The most bytes a request line and headers may take (long signed URLs and tokens fit)."""
MAX_CONNECTIONS = 4096
"""Connections and tasks served at once; past it uvicorn answers 503 instead of accepting more work."""


@image_app.command("build")
def image_build(
    *,
    tag: Annotated[str, typer.Option(help="image name")] = "corral/workspace:base",
    if_missing: Annotated[bool, typer.Option("--if-missing", help="skip when an up-to-date image exists")] = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="on a terminal, also print every line of tool output")
    ] = False,
) -> None:
    """Build the workspace base image from Debian packages (mmdebstrap + docker import)."""
    from corral.images.base import build_base_image

    display = BuildDisplay(_stderr(), verbose=verbose)
    try:
        with display:
            built = build_base_image(tag, if_missing=if_missing, progress=display.line)
    except (RuntimeError, FileNotFoundError) as exc:
        typer.echo(f"corral: image build failed: {exc}", err=True)
        raise typer.Exit(1) from exc
    if not built:
        typer.echo(f"corral: {tag} is up to date", err=True)


@image_app.command("build-rootfs")
def image_build_rootfs(
    *,
    output: Annotated[Path, typer.Option(help="the ext4 image to write")],
    image: Annotated[str, typer.Option(help="the container image to start from")] = "corral/workspace:base",
    if_missing: Annotated[bool, typer.Option("--if-missing", help="skip when an up-to-date rootfs exists")] = False,
) -> None:
    """Build the microVM root filesystem (base image + init + agent) as an ext4 image."""
    from corral.microvm.rootfs import build_rootfs_sync

    try:
        build_rootfs_sync(output, image=image, if_missing=if_missing, progress=lambda line: typer.echo(line, err=True))
    except (RuntimeError, OSError) as exc:
        typer.echo(f"corral: rootfs build failed: {exc}", err=True)
        raise typer.Exit(1) from exc


@app.command("firecracker-manager")
def firecracker_manager(
    *,
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to bind")] = 8100,
    uds: Annotated[str | None, typer.Option(help="listen on this Unix socket instead")] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error")] = "info",
) -> None:
    """Serve the Firecracker manager's HTTP API (GET /health, /vms ...) for CORRAL_FIRECRACKER_MANAGER_URL."""
    from corral.microvm.server import serve_manager
    from corral.settings import Settings

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve_manager(Settings(), host=host, port=port, uds=uds, log_level=log_level)


class BuildDisplay:
    """Shows ``build_base_image``'s progress lines: on a terminal, a spinner naming the current step with its
    latest output line (every line with ``--verbose``), and a check mark per finished step; elsewhere (logs, CI),
    every line as plain text on stderr, exactly as before.

    Lines starting with two spaces are tool output; the others name a step.
    """

    def __init__(self, console: Console, *, verbose: bool = False) -> None:
        self.console = console
        self.verbose = verbose
        self.step: str | None = None
        self._status: Any = None

    def __enter__(self) -> BuildDisplay:
        if self.console.is_terminal:
            self._status = self.console.status("starting", spinner="dots")
            self._status.__enter__()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self._status is not None:
            self._status.__exit__(None, None, None)
            self._status = None
        if self.step is not None and exc_type is None and self.console.is_terminal:
            self.console.print(f"[green]✓[/] {self.step}", markup=True)

    def line(self, text: str) -> None:
        """One progress line from the build."""
        if self._status is None:  # not a terminal (logs, CI): every line, plain, as it always was
            typer.echo(text, err=True)
            return
        output = text.startswith("  ")
        if output:
            if self.verbose:
                self.console.print(text, markup=False, style="dim")
            from rich.text import Text

            self._status.update(Text.assemble(self.step or "", ("  " + text.strip()[:100], "dim")))
            return
        if self.step is not None:
            self.console.print(f"[green]✓[/] {self.step}", markup=True)
        self.step = text
        from rich.text import Text

        self._status.update(Text(text))


# --- server state -----------------------------------------------------------------------------------------------


@app.command()
def providers(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """Show every provider's health, active workspaces and last error."""
    from rich.table import Table

    with _corral(ctx) as corral:
        statuses = corral.providers()
    if as_json:
        _print_json([dict(s.raw) for s in statuses])
        return
    table = Table("PROVIDER", "STATUS", "ACTIVE", "LAST CHECK", "ERROR", box=None, pad_edge=False)
    for s in statuses:
        colour = "green" if s.healthy else "red"
        checked = s.last_check.strftime("%H:%M:%S") if s.last_check else "-"
        table.add_row(s.name, f"[{colour}]{s.status}[/]", str(s.active_workspaces), checked, s.error or "")
    _show(table)


@app.command()
def pool(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """Show the warm pools: target and current size, hits and misses."""
    from rich.table import Table

    with _corral(ctx) as corral:
        report = corral.pool()
    if as_json:
        _print_json({"pools": [dict(p.raw) for p in report.pools], "unpooled_misses": dict(report.unpooled_misses)})
        return
    table = Table("PROVIDER", "IMAGE", "SIZE", "TARGET", "HITS", "MISSES", "LAST ERROR", box=None, pad_edge=False)
    for p in report.pools:
        table.add_row(p.provider, p.image, str(p.size), str(p.target), str(p.hits), str(p.misses), p.last_error or "")
    _show(table if report.pools else "no warm pools configured (CORRAL_WARM_POOL_SIZE=0)")


# --- workspaces -------------------------------------------------------------------------------------------------


def _limits(info: WorkspaceInfo) -> str:
    return " ".join(f"{k}={v}" for k, v in info.resource_limits.items())


def _workspace_table(workspaces: Sequence[WorkspaceInfo]) -> Any:
    from rich.table import Table

    table = Table("ID", "STATUS", "PROVIDER", "NETWORK", "LIMITS", "CREATED", box=None, pad_edge=False)
    for w in workspaces:
        created = w.created_at.strftime("%Y-%m-%d %H:%M:%S") if w.created_at else "-"
        table.add_row(w.id, w.status, w.provider or "-", w.network, _limits(w), created)
    return table


def _describe(pairs: Mapping[str, object]) -> Any:
    from rich.table import Table

    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for key, value in pairs.items():
        shown = value if isinstance(value, str) else json.dumps(value, default=str)
        table.add_row(key, shown)
    return table


def _report_workspace(info: WorkspaceInfo) -> None:
    """What a person wants to know after a create: where it runs, and anything that went wrong on the way."""
    err = _stderr()
    warm = ", from the warm pool" if info.from_warm_pool else ""
    err.print(f"workspace {info.id} {info.status} on {info.provider}{warm}", markup=False)
    for attempt in info.provider_attempts:
        err.print(f"[yellow]fallback:[/] {attempt.provider} failed: {attempt.error}")
    for warning in info.warnings:
        err.print(f"[yellow]warning:[/] {warning}")


@workspaces_app.command("create")
def workspaces_create(
    ctx: typer.Context,
    *,
    provider: Annotated[str, typer.Option(help="auto, gvisor, docker, firecracker, e2b...")] = "auto",
    cpu: Annotated[str | None, typer.Option(help="CPUs, e.g. 2")] = None,
    memory: Annotated[str | None, typer.Option(help="memory, e.g. 4G")] = None,
    disk: Annotated[str | None, typer.Option(help="disk, e.g. 10G")] = None,
    image: Annotated[str | None, typer.Option(help="base image instead of the server's")] = None,
    network: Annotated[str | None, typer.Option(help="isolated (default: no network) or default")] = None,
    container_type: Annotated[str | None, typer.Option(help="agent_workspace (default) or mcp_server")] = None,
    meta: Annotated[list[str] | None, typer.Option("--meta", help="metadata KEY=VALUE (repeatable)")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Create a workspace and print its id (details go to stderr).

    WS=$(corral workspaces create --provider gvisor)
    """
    limits = {k: v for k, v in {"cpu": cpu, "memory": memory, "disk": disk}.items() if v is not None}
    with _corral(ctx) as corral:
        ws = corral.workspaces.create(
            provider=provider,
            container_type=container_type,
            resource_limits=limits or None,
            base_image=image,
            network=network,
            metadata=_pairs(meta or [], "--meta") or None,
        )
    if as_json:
        _print_json(dict(ws.info.raw))
        return
    _report_workspace(ws.info)
    typer.echo(ws.id)


@workspaces_app.command("list")
def workspaces_list(
    ctx: typer.Context,
    *,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="print only the ids")] = False,
    as_json: JsonFlag = False,
) -> None:
    """List the workspaces that are not destroyed."""
    with _corral(ctx) as corral:
        infos = [w.info for w in corral.workspaces.list()]
    if as_json:
        _print_json([dict(i.raw) for i in infos])
    elif quiet:
        for info in infos:
            typer.echo(info.id)
    else:
        _show(_workspace_table(infos) if infos else "no workspaces")


@workspaces_app.command("show")
def workspaces_show(ctx: typer.Context, workspace_id: str, as_json: JsonFlag = False) -> None:
    """Show one workspace."""
    with _corral(ctx) as corral:
        info = corral.workspaces.get(workspace_id).info
    if as_json:
        _print_json(dict(info.raw))
        return
    _show(_describe(dict(info.raw)))


@workspaces_app.command(
    "exec", context_settings={"allow_interspersed_args": False, "help_option_names": ["-h", "--help"]}
)
def workspaces_exec(
    ctx: typer.Context,
    *,
    workspace_id: Annotated[str, typer.Argument(help="the workspace")],
    command: Annotated[list[str], typer.Argument(help="a command line, or a program and its arguments")],
    argv: Annotated[bool, typer.Option("--argv", help="run the program directly, without a shell")] = False,
    cwd: Annotated[str | None, typer.Option(help="working directory (default /workspace)")] = None,
    env: Annotated[list[str] | None, typer.Option("--env", "-e", help="environment KEY=VALUE (repeatable)")] = None,
    timeout: Annotated[
        float | None, typer.Option(help="kill the command after this many seconds (default 600)")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Run a command in a workspace; print its output and exit with its exit code.

    Options go before the workspace id, as with docker exec. One argument is a shell command line, run by
    /bin/sh -c; more are a program and its arguments (still through the shell, quoted, unless --argv):

    corral workspaces exec $WS 'cd src && ls | wc -l'
    corral workspaces exec --argv $WS -- ls -la /workspace

    With --json the result is printed as JSON; the exit code is still the command's.
    """
    if command[:1] == ["--"]:  # after the workspace id every word is the command's, so `--` is left to drop here
        command = command[1:]
    if not command:
        raise typer.BadParameter("missing the command to run")
    with _corral(ctx) as corral:
        workspace = corral.workspaces.get(workspace_id)
        result = workspace.exec(
            command[0],
            args=command[1:],
            mode="argv" if argv else "shell",
            cwd=cwd,
            env=_pairs(env or [], "--env") or None,
            timeout_s=timeout,
        )
    if as_json:
        _print_json({"exit_code": result.exit_code, "stdout": result.stdout, "stderr": result.stderr,
                     "duration_ms": result.duration_ms, "timed_out": result.timed_out,
                     "truncated": result.truncated})  # fmt: skip
    else:
        sys.stdout.write(result.stdout)
        sys.stdout.flush()
        sys.stderr.write(result.stderr)
        if result.timed_out:
            sys.stderr.write(f"corral: the command timed out and was killed (exit code {result.exit_code})\n")
        if result.truncated:
            sys.stderr.write("corral: output past the server's limit was dropped\n")
        sys.stderr.flush()
    raise typer.Exit(result.exit_code)


@workspaces_app.command("stop")
def workspaces_stop(ctx: typer.Context, workspace_id: str, as_json: JsonFlag = False) -> None:
    """Stop a workspace; /workspace is kept for resume."""
    with _corral(ctx) as corral:
        info = corral.workspaces.get(workspace_id).stop()
    _print_json(dict(info.raw)) if as_json else typer.echo(f"{info.id} {info.status}")


@workspaces_app.command("resume")
def workspaces_resume(ctx: typer.Context, workspace_id: str, as_json: JsonFlag = False) -> None:
    """Resume a stopped workspace with its /workspace as it was."""
    with _corral(ctx) as corral:
        info = corral.workspaces.get(workspace_id).resume()
    _print_json(dict(info.raw)) if as_json else typer.echo(f"{info.id} {info.status}")


@workspaces_app.command("rm")
def workspaces_rm(ctx: typer.Context, workspace_ids: Annotated[list[str], typer.Argument(help="one or more")]) -> None:
    """Destroy workspaces (container and volume); each one's error is reported and the rest still go."""
    from corral.errors import CorralError

    failed = False
    with _corral(ctx) as corral:
        for workspace_id in workspace_ids:
            try:
                corral.workspaces.get(workspace_id).destroy()
            except CorralError as exc:
                typer.echo(" ".join(f"error: {exc.code}: {exc.message}".split()), err=True)
                failed = True
            else:
                typer.echo(workspace_id)
    if failed:
        raise typer.Exit(1)


# --- agent types ------------------------------------------------------------------------------------------------


def _apply_config_flags(
    base: dict[str, Any],
    *,
    enabled: bool | None,
    tools: str | None,
    repo: str | None,
    branch: str | None,
    setup: Sequence[str],
    provider: str | None,
) -> dict[str, Any]:
    config = dict(base)
    flags_given = any(v is not None for v in (tools, repo, branch, provider)) or bool(setup)
    if tools is not None:
        config["tools"] = [t.strip() for t in tools.split(",") if t.strip()]
    if repo is not None or branch is not None:
        source = dict(config.get("repo_source") or {})
        if repo == "task":
            source.update(type="task_context", url=None)
        elif repo == "none":
            source.update(type="none", url=None)
        elif repo is not None:
            source.update(type="fixed", url=repo)
        if branch is not None:
            source["branch"] = branch
        config["repo_source"] = source
    if setup:
        config["setup_commands"] = list(setup)
    if provider is not None:
        config["provider"] = provider
    if enabled is not None:
        config["enabled"] = enabled
    elif flags_given and "enabled" not in base:
        config["enabled"] = True
    return config


EnableFlag = Annotated[bool | None, typer.Option("--enable/--disable", help="give the type's sessions a workspace")]
ToolsOption = Annotated[
    str | None, typer.Option("--tools", help="allowed tools, comma-separated: bash,read,write,edit,grep,glob,git")
]
RepoOption = Annotated[
    str | None, typer.Option("--repo", help="repository: an http(s) URL, 'task' (from the task) or 'none'")
]
BranchOption = Annotated[str | None, typer.Option("--branch", help="branch to check out")]
SetupOption = Annotated[list[str] | None, typer.Option("--setup", help="a setup command (repeatable, run in order)")]
ProviderOption = Annotated[str | None, typer.Option("--provider", help="auto, gvisor, docker...")]


def _show_agent_type(type_id: str, name: str, config: Mapping[str, Any]) -> None:
    _show(_describe({"id": type_id, "name": name, **config}))


@agent_types_app.command("create")
def agent_types_create(
    ctx: typer.Context,
    *,
    name: str,
    workspace: Annotated[str | None, typer.Option(help="the workspace config as JSON, @FILE or - (stdin)")] = None,
    enabled: EnableFlag = None,
    tools: ToolsOption = None,
    repo: RepoOption = None,
    branch: BranchOption = None,
    setup: SetupOption = None,
    provider: ProviderOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Declare an agent type and print its id. Any workspace flag enables its workspace.

    corral agent-types create reviewer --tools read,grep,glob --repo task
    """
    base = _parse_json_object(workspace, "--workspace") if workspace is not None else {}
    config = _apply_config_flags(
        base, enabled=enabled, tools=tools, repo=repo, branch=branch, setup=setup or [], provider=provider
    )
    with _corral(ctx) as corral:
        agent_type = corral.agent_types.create(name, workspace=config or None)
    if as_json:
        _print_json({"id": agent_type.id, "name": agent_type.name, "workspace": dict(agent_type.workspace)})
        return
    tools_text = ", ".join(agent_type.tools) or "none (no workspace)"
    _stderr().print(f"agent type {agent_type.name!r}: tools {tools_text}", markup=False)
    typer.echo(agent_type.id)


@agent_types_app.command("list")
def agent_types_list(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """List the agent types."""
    from rich.table import Table

    with _corral(ctx) as corral:
        types = corral.agent_types.list()
    if as_json:
        _print_json([{"id": t.id, "name": t.name, "workspace": dict(t.workspace)} for t in types])
        return
    table = Table("ID", "NAME", "WORKSPACE", "TOOLS", box=None, pad_edge=False)
    for t in types:
        table.add_row(t.id, t.name, "enabled" if t.workspace.get("enabled") else "disabled", ",".join(t.tools))
    _show(table if types else "no agent types")


@agent_types_app.command("show")
def agent_types_show(ctx: typer.Context, agent_type_id: str, as_json: JsonFlag = False) -> None:
    """Show an agent type and its whole workspace configuration."""
    with _corral(ctx) as corral:
        agent_type = corral.agent_types.get(agent_type_id)
    if as_json:
        _print_json({"id": agent_type.id, "name": agent_type.name, "workspace": dict(agent_type.workspace)})
        return
    _show_agent_type(agent_type.id, agent_type.name, agent_type.workspace)


@agent_types_app.command("set-config")
def agent_types_set_config(
    ctx: typer.Context,
    *,
    agent_type_id: str,
    config: Annotated[str | None, typer.Argument(help="the whole config as JSON, @FILE or - (stdin)")] = None,
    enabled: EnableFlag = None,
    tools: ToolsOption = None,
    repo: RepoOption = None,
    branch: BranchOption = None,
    setup: SetupOption = None,
    provider: ProviderOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Replace an agent type's workspace config, or change fields of the current one with flags.

    corral agent-types set-config $TYPE '{"enabled": true, "tools": ["read", "grep"]}'
    corral agent-types set-config $TYPE --tools bash,read,write --setup 'pip install -e .'

    Sessions started afterwards use the new config; running ones keep theirs.
    """
    with _corral(ctx) as corral:
        base = _parse_json_object(config, "config") if config is not None else corral.agent_types.config(agent_type_id)
        new = _apply_config_flags(
            base, enabled=enabled, tools=tools, repo=repo, branch=branch, setup=setup or [], provider=provider
        )
        stored = corral.agent_types.set_config(agent_type_id, new)
    if as_json:
        _print_json(stored)
        return
    _show(_describe(stored))


# --- sessions ---------------------------------------------------------------------------------------------------


def _report_session(info: SessionInfo) -> None:
    err = _stderr()
    where = f" (workspace {info.workspace_id})" if info.workspace_id else " (no workspace)"
    err.print(f"session {info.id} {info.status}{where}", markup=False)
    for warning in info.warnings:
        err.print(f"[yellow]warning:[/] {warning}")
    if info.degraded:
        err.print(f"[red]degraded:[/] {info.degraded_reason}")


@sessions_app.command("start")
def sessions_start(
    ctx: typer.Context,
    *,
    agent_type_id: str,
    repo_url: Annotated[
        str | None, typer.Option("--repo-url", help="the task's repository (credentials allowed)")
    ] = None,
    branch: Annotated[str | None, typer.Option(help="the task's branch")] = None,
    pr: Annotated[int | None, typer.Option("--pr", help="the pull request number")] = None,
    base_branch: Annotated[str | None, typer.Option(help="the pull request's base branch")] = None,
    context: Annotated[str | None, typer.Option(help="the whole task context as JSON, @FILE or -")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="poll until the workspace is ready; show warnings")] = False,
    timeout: Annotated[float, typer.Option(help="seconds --wait may take")] = 300.0,
    as_json: JsonFlag = False,
) -> None:
    """Start a session and print its id; with --wait, return once it is active.

    S=$(corral sessions start $TYPE --repo-url https://github.com/org/repo.git --branch main --wait)
    """
    task = _parse_json_object(context, "--context") if context is not None else {}
    fields = {"repository_url": repo_url, "branch": branch, "pull_request_number": pr, "base_branch": base_branch}
    task.update({k: v for k, v in fields.items() if v is not None})
    with _corral(ctx) as corral:
        session = corral.sessions.start(agent_type_id, task_context=task or None)
        if wait and session.status == "provisioning":
            err = _stderr()
            with err.status(f"provisioning session {session.id}", spinner="dots"):
                session.wait(timeout_s=timeout)
    if as_json:
        _print_json(dict(session.info.raw))
        return
    _report_session(session.info)
    typer.echo(session.id)


@sessions_app.command("show")
def sessions_show(ctx: typer.Context, session_id: str, as_json: JsonFlag = False) -> None:
    """Show a session: status, workspace, warnings, degraded reason."""
    with _corral(ctx) as corral:
        info = corral.sessions.get(session_id).info
    if as_json:
        _print_json(dict(info.raw))
        return
    _show(_describe(dict(info.raw)))


@sessions_app.command("end")
def sessions_end(ctx: typer.Context, session_id: str, as_json: JsonFlag = False) -> None:
    """End a session and destroy its workspace."""
    with _corral(ctx) as corral:
        info = corral.sessions.get(session_id).end()
    _print_json(dict(info.raw)) if as_json else typer.echo(f"{info.id} {info.status}")


@sessions_app.command("audit")
def sessions_audit(ctx: typer.Context, session_id: str, as_json: JsonFlag = False) -> None:
    """Show every tool call of a session, refused ones included."""
    from rich.table import Table

    with _corral(ctx) as corral:
        entries = corral.sessions.get(session_id).audit()
    if as_json:
        _print_json([{"at": e.at, "tool": e.tool, "arguments_summary": e.arguments_summary, "status": e.status,
                      "duration_ms": e.duration_ms} for e in entries])  # fmt: skip
        return
    table = Table("AT", "TOOL", "STATUS", "MS", "ARGUMENTS", box=None, pad_edge=False)
    for e in entries:
        at = e.at.strftime("%H:%M:%S") if e.at else "-"
        table.add_row(at, e.tool, e.status, f"{e.duration_ms:.0f}", e.arguments_summary)
    _show(table if entries else "no tool calls yet")


@sessions_app.command("tool")
def sessions_tool(
    ctx: typer.Context,
    *,
    session_id: str,
    tool: Annotated[str, typer.Argument(help="bash, read, write, edit, grep, glob or git")],
    value: Annotated[str | None, typer.Argument(help="the main argument, a JSON object, @FILE or -")] = None,
    arg: Annotated[list[str] | None, typer.Option("--arg", "-a", help="key=text or key:=json (repeatable)")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Call one of the session's tools, as the agent would. The agent type's tool policy applies.

    Give the tool's JSON arguments (see the HTTP API) as any mix of:

    a bare value, for the tool's main argument:
      bash 'ls -la' | read README.md | grep TODO | glob '**/*.py' | git 'log --oneline -3'
    --arg key=text (always a string) or --arg key:=json (numbers, booleans, lists):
      corral sessions tool $S bash -a command='sleep 5; echo done' -a timeout_s:=30
    a JSON object, @file or - (stdin):
      corral sessions tool $S edit '{"path": "a.py", "old_string": "x = 1", "new_string": "x = 2"}'

    bash and git print their output and exit with the command's exit code; read prints the text; --json prints the
    tool's JSON result.
    """
    arguments = parse_tool_arguments(tool, value, arg or [])
    with _corral(ctx) as corral:
        result = corral.sessions.get(session_id).tools.call(tool, arguments)
    if as_json:
        _print_json(result)
        if tool in ("bash", "git"):
            raise typer.Exit(int(result.get("exit_code") or 0))
        return
    _print_tool_result(tool, result)


def _print_tool_result(tool: str, result: Mapping[str, Any]) -> None:
    if tool in ("bash", "git"):
        sys.stdout.write(str(result.get("stdout", "")))
        sys.stdout.flush()
        sys.stderr.write(str(result.get("stderr", "")))
        sys.stderr.flush()
        raise typer.Exit(int(result.get("exit_code") or 0))
    if tool == "read":
        content = str(result.get("content", ""))
        sys.stdout.write(content + ("\n" if sys.stdout.isatty() and not content.endswith("\n") else ""))
        if result.get("truncated"):
            sys.stderr.write(f"corral: more lines follow ({result.get('total_lines')} in all)\n")
    elif tool == "glob":
        for path in result.get("paths", []):
            typer.echo(path)
    elif tool == "grep":
        for m in result.get("matches", []):
            typer.echo(f"{m.get('path')}:{m.get('line_number')}:{m.get('line')}")
    elif tool == "write":
        typer.echo(f"wrote {result.get('bytes_written')} bytes")
    elif tool == "edit":
        typer.echo(f"{result.get('replacements')} replacement(s)")
    else:
        _print_json(result)


# --- MCP --------------------------------------------------------------------------------------------------------


@app.command()
def mcp(
    ctx: typer.Context,
    *,
    session: Annotated[str | None, typer.Option("--session", help="serve this session's tools")] = None,
    agent_type: Annotated[
        str | None,
        typer.Option("--agent-type", help="start a session of this type, serve its tools, end it on exit"),
    ] = None,
    repo_url: Annotated[str | None, typer.Option("--repo-url", help="with --agent-type: the task's repository")] = None,
    branch: Annotated[str | None, typer.Option(help="with --agent-type: the task's branch")] = None,
    timeout: Annotated[
        float, typer.Option(help="with --agent-type: seconds the session may take to provision")
    ] = 300.0,
) -> None:
    """Serve a session's allowed tools over MCP on stdin/stdout.

    Only the tools the agent type allows are listed; every call goes through Corral's HTTP API, so the server
    enforces the policy and audits it. In an MCP client's configuration:

    {"command": "corral", "args": ["mcp", "--agent-type", "TYPE_ID"],
     "env": {"CORRAL_URL": "http://127.0.0.1:8000", "CORRAL_API_TOKEN": "..."}}
    """
    if (session is None) == (agent_type is None):
        raise typer.BadParameter("give exactly one of --session and --agent-type")
    import anyio

    from corral.errors import CorralError
    from corral.mcp_server import serve_stdio

    remote: Remote = ctx.obj if isinstance(ctx.obj, Remote) else Remote(None, None)
    task = {k: v for k, v in {"repository_url": repo_url, "branch": branch}.items() if v is not None}
    # stdout carries the protocol: everything else goes to stderr, where MCP clients keep the server's log.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="corral mcp: %(message)s")
    logging.getLogger("corral.mcp_server").setLevel(logging.INFO)
    try:
        anyio.run(
            lambda: serve_stdio(
                session_id=session,
                agent_type_id=agent_type,
                task_context=task or None,
                base_url=remote.url,
                token=remote.token,
                wait_timeout_s=timeout,
            )
        )
    except CorralError as exc:
        _fail(exc.code, exc.message)
    except TimeoutError as exc:
        _fail("timeout", str(exc))


def main() -> None:
    """Entry point of the ``corral`` script."""
    app()


if __name__ == "__main__":
    main()
