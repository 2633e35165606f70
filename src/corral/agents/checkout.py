"""Checking a repository out into a workspace, with its credentials kept on the host.

The clone runs on the host, never in the workspace: it works for workspaces without any network (the default
``isolated`` mode), and credentials never enter the sandbox. A URL such as
``https://x-access-token:SECRET@host/org/repo.git`` is split (:func:`corral.credentials.split_url`): git clones the
clean URL and receives the secret as an ``Authorization`` header through ``GIT_CONFIG_*`` environment variables, so
it appears in no argument list, no ``.git/config``, no reflog and no file. URLs with a secret in their query are
refused when they are given (git cannot clone them, and git would pass them to its helpers' argv). The finished
checkout is streamed into the workspace as a tar archive and unpacked under ``/workspace``; ``origin`` points at the
clean URL. Every error message built from git's output is masked (:func:`corral.credentials.redact_text`).

Only http(s) is cloned (``GIT_ALLOW_PROTOCOL``), so a task cannot make the host run ``ext::`` commands or read local
paths through ``file://``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass

from corral.credentials import SplitURL, redact_text, split_url
from corral.errors import CheckoutError, CorralError, ExecTimeoutError
from corral.providers.base import WORKSPACE_ROOT, ExecMode, ExecRequest, WorkspaceCalls

__all__ = ["RepoRef", "checkout", "resolve_commit", "split_credentials"]

CLONE_TIMEOUT_S = 600.0
COMMIT_IDENTITY = {"user.name": "Corral Agent", "user.email": "agent@corral.invalid"}
_ARCHIVE = "/tmp/.corral-checkout.tar"  # noqa: S108 - a path inside the workspace's sandbox, not on the host


@dataclass(frozen=True, slots=True)
class RepoRef:
    """A repository and the branch to check out (None: the remote's default branch)."""

    url: str
    branch: str | None = None


def split_credentials(url: str) -> tuple[str, str | None]:
    """``(clean url, "Basic ..." header value or None)``; see :func:`corral.credentials.split_url` for the rest."""
    split = split_url(url)
    return split.clean, split.authorization


def _git_env(home: str, split: SplitURL | None) -> dict[str, str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": home,  # no user config of the server's account leaks in
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ASKPASS": "/bin/false",
        "GIT_ALLOW_PROTOCOL": "http:https",
        "LC_ALL": "C",
    }
    config: list[tuple[str, str]] = []
    if split is not None and split.authorization is not None:
        config.append(("http.extraHeader", f"Authorization: {split.authorization}"))
    if config:
        env["GIT_CONFIG_COUNT"] = str(len(config))
        for index, (key, value) in enumerate(config):
            env[f"GIT_CONFIG_KEY_{index}"], env[f"GIT_CONFIG_VALUE_{index}"] = key, value
    return env


def _explain(stderr: str, clean_url: str, branch: str | None) -> str:
    stderr = redact_text(stderr)  # git prints the URL it fetched, secret parameters included
    text = stderr.lower()
    if branch and ("remote branch" in text and "not found" in text):
        return f"branch {branch!r} does not exist in {clean_url}"
    if "authentication failed" in text or "401" in text or "403" in text or "could not read username" in text:
        return f"authentication to {clean_url} failed (check the credentials in the repository URL)"
    if "not found" in text or "404" in text or "does not appear to be a git repository" in text:
        return f"no git repository at {clean_url}"
    if "could not resolve host" in text or "failed to connect" in text or "unable to access" in text:
        return f"cannot reach {clean_url}: {stderr.strip().splitlines()[-1] if stderr.strip() else 'no answer'}"
    last = stderr.strip().splitlines()[-1] if stderr.strip() else "git clone failed"
    return f"cloning {clean_url} failed: {last}"


async def _run(argv: list[str], env: dict[str, str], timeout_s: float) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        _, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except BaseException:  # timed out, or cancelled (session ended, server shutting down): git must not run on
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await asyncio.shield(proc.wait())
        raise
    return proc.returncode or 0, err.decode(errors="replace")


async def _tar_stream(directory: str) -> AsyncIterator[bytes]:
    proc = await asyncio.create_subprocess_exec(
        "tar", "-C", directory, "-cf", "-", ".", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None
    try:
        while chunk := await proc.stdout.read(256 * 1024):
            yield chunk
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        await proc.wait()


async def checkout(
    provider: WorkspaceCalls, workspace_id: str, repo: RepoRef, *, timeout_s: float = CLONE_TIMEOUT_S
) -> str:
    """Clone ``repo`` on the host and unpack it into ``/workspace``; returns the checked-out commit.

    Raises:
        CheckoutError: a bad URL, a missing branch, failed authentication, or an unreachable host.
    """
    split = split_url(repo.url)
    clean_url = split.clean
    with tempfile.TemporaryDirectory(prefix="corral-clone-") as tmp:
        target = os.path.join(tmp, "repo")
        argv = ["git", "clone", "--quiet", "--no-recurse-submodules"]
        if repo.branch:
            argv += ["--branch", repo.branch]
        argv += ["--", clean_url, target]
        try:
            code, stderr = await _run(argv, _git_env(tmp, split), timeout_s)
        except TimeoutError:
            raise CheckoutError(f"cloning {clean_url} did not finish within {timeout_s:g} s") from None
        if code != 0:
            raise CheckoutError(_explain(stderr, clean_url, repo.branch), details={"url": clean_url})
        code, head = await _capture(["git", "-C", target, "rev-parse", "HEAD"], _git_env(tmp, None))
        for key, value in COMMIT_IDENTITY.items():  # so the agent can commit without setting an identity first
            await _capture(["git", "-C", target, "config", key, value], _git_env(tmp, None))
        await provider.write_file(workspace_id, _ARCHIVE, _tar_stream(target))
    unpack = ExecRequest(
        "tar", ("-xf", _ARCHIVE, "-C", WORKSPACE_ROOT, "--no-same-owner"), mode=ExecMode.ARGV, timeout_s=timeout_s
    )
    try:
        result = await provider.exec(workspace_id, unpack)
    except ExecTimeoutError:
        raise CheckoutError(f"unpacking the checkout did not finish within {timeout_s:g} s") from None
    finally:
        with contextlib.suppress(CorralError):
            await provider.delete(workspace_id, _ARCHIVE)
    if result.exit_code != 0:
        stderr = redact_text(result.stderr.decode(errors="replace").strip())
        raise CheckoutError(f"unpacking the checkout failed: {stderr}")
    return head.strip()


async def resolve_commit(repo: RepoRef, *, timeout_s: float = 60.0) -> str:
    """The commit ``repo``'s branch (or default branch) points at now, asked on the host with ``git ls-remote``
    (same credentials handling and protocols as :func:`checkout`).

    Raises:
        CheckoutError: the remote cannot be asked, or has no such branch.
    """
    split = split_url(repo.url)
    ref = f"refs/heads/{repo.branch}" if repo.branch else "HEAD"
    with tempfile.TemporaryDirectory(prefix="corral-ls-remote-") as tmp:
        argv = ["git", "ls-remote", "--", split.clean, ref]
        proc = await asyncio.create_subprocess_exec(
            *argv, env=_git_env(tmp, split), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise CheckoutError(f"asking {split.clean} for {ref} did not finish within {timeout_s:g} s") from None
    line = next((ln for ln in out.decode(errors="replace").splitlines() if ln.endswith(f"\t{ref}")), "")
    if proc.returncode != 0 or not line:
        reason = _explain(err.decode(errors="replace"), split.clean, repo.branch) if proc.returncode else "no such ref"
        raise CheckoutError(f"cannot resolve {ref} of {split.clean}: {reason}", details={"url": split.clean})
    return line.split("\t", 1)[0]


async def _capture(argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(*argv, env=env, stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode()
