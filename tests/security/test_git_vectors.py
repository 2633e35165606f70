"""Known ways to make git run a program or write outside /workspace, each refused or harmless through the git tool.

Every vector runs in one real gVisor workspace through the :class:`~corral.tools.Toolbox`. Its setup (plain shell as
root, standing for what a hostile agent, repository or earlier tool call can leave behind) plants a payload that
creates ``/tmp/pwned`` (or writes a path outside /workspace). The tool calls must then be refused or leave no marker,
and the same attack with plain git afterwards (the control) must leave one, which proves the vector is real.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import pytest_asyncio

from corral.errors import ToolError
from corral.providers._docker_engine import DockerAPIError, DockerEngine
from corral.providers.base import ExecMode, ExecRequest, WorkspaceSpec
from corral.providers.gvisor import GVisorProvider
from corral.tools import Toolbox
from tests.conftest import BASE_IMAGE, DOCKER_SOCKET

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

MARKER = "test -e /tmp/pwned || test -e /workspace/pwned"
PRELUDE = "set -e; printf '#!/bin/sh\\ntouch /tmp/pwned\\n' > /workspace/payload; chmod +x /workspace/payload; "
REPO = (
    "git init -q -b main; git config user.email a@example.com; git config user.name A; echo hello > a.txt; "
    "git add a.txt; git commit -qm initial; "
)
TWO = REPO + "echo two > a.txt; git commit -qam two; "
FEATURE = REPO + (
    "git checkout -qb feature; echo feature > a.txt; git commit -qam feature; git checkout -q main; "
    "echo main > a.txt; git commit -qam main; "
)
# A plain HTTP server in the sandbox that sets a cookie on every answer: an empty repository, or under /auth/ a
# request for credentials.
HTTP_SERVER = (
    "printf '%s\\n' 'import http.server' 'class H(http.server.BaseHTTPRequestHandler):' "
    "'    def do_GET(self):' '        self.send_response(401 if \"auth\" in self.path else 200)' "
    '\'        self.send_header("WWW-Authenticate", "Basic realm=x")\' '
    '\'        self.send_header("Set-Cookie", "s=1; Path=/")\' \'        self.send_header("Content-Length", "0")\' '
    "'        self.end_headers()' '    def log_message(self, *args): pass' "
    "'http.server.HTTPServer((\"127.0.0.1\", 8765), H).serve_forever()' > /tmp/srv.py; "
    "setsid python3 /tmp/srv.py > /dev/null 2>&1 < /dev/null & echo $! > /tmp/srv.pid; "
    "n=0; until python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8765), 1)' 2> /dev/null; do "
    "n=$((n + 1)); test $n -lt 300; done; "  # poll until the server answers; set -e ends the setup at the deadline
)
PLANTED_GIT_DIR = (
    ("evil/HEAD", "ref: refs/heads/main\n"),
    ("evil/objects/.keep", ""),
    ("evil/refs/heads/.keep", ""),
    ("evil/config", '[core]\n\tbare = true\n[alias]\n\tx = "!id > /workspace/pwned"\n'),
)
OUTSIDE = "outside /workspace"


@dataclass(frozen=True)
class Attack:
    """One vector: what is planted, what the agent asks the git tool, and the same attack with plain git."""

    name: str
    setup: str
    calls: tuple[tuple[tuple[str, ...], str | None], ...]
    """git arguments and the refusal expected (a regex of the ToolError), or None: it may run, harmlessly."""
    control: str | None = None
    """Plain git with no protections, run afterwards; it must leave ``leaves`` true."""
    leaves: str = MARKER
    writes: tuple[tuple[str, str], ...] = ()
    """Files written with the write tool before the git calls."""
    escapes: tuple[str, ...] = ()
    """Paths outside /workspace (or in .git) that must not exist after the git calls."""


def ok(*args: str) -> tuple[tuple[str, ...], None]:
    return args, None


def no(refusal: str, *args: str) -> tuple[tuple[str, ...], str]:
    return args, refusal


ATTACKS = [
    Attack(
        "planted-git-dir-alias-via-git-dir",
        "",
        (no("'--git-dir' is refused", "--git-dir=/workspace/evil", "x"),
         no("'--git-dir' is refused", "--git-dir=/workspace/evil", "status")),
        control="git --git-dir=/workspace/evil x",
        writes=PLANTED_GIT_DIR,
    ),
    Attack(
        "planted-git-dir-alias-via-dash-C",
        "",
        (no("'x' is refused", "-C", "evil", "x"), ok("-C", "evil", "status"), ok("-C", "evil", "log")),
        control="git -C evil x",
        writes=PLANTED_GIT_DIR,
    ),
    Attack(
        "commit-message-written-into-config-with-output",
        "",
        (ok("init", "-q"), ok("config", "user.name", "A"), ok("config", "user.email", "a@example.com"),
         ok("commit", "--allow-empty", "-m", '[alias]\n\tx = "!id > /workspace/pwned"'),
         no("'--output' is refused", "log", "-1", "--format=%B", "--output=/workspace/.git/config"),
         no("'--output' is refused", "log", "-1", "--format=%B", "--outp=.git/config"),
         no("'--output' is refused", "show", "-s", "--format=%B", "--output", ".git/config"),
         no("'x' is refused", "x")),
        control="git log -1 --format=%B --output=/workspace/.git/config && git x",
    ),
    Attack(
        "diff-output-outside",
        REPO,
        (no("'--output' is refused", "diff", "--output=/etc/corral-escape", "HEAD"),
         no("'--output' is refused", "diff", "HEAD", "--output", "/tmp/escape-diff")),
        control="git diff --output=/tmp/escape-diff HEAD",
        leaves="test -e /tmp/escape-diff",
        escapes=("/etc/corral-escape", "/tmp/escape-diff"),
    ),
    Attack(
        "init-and-clone-outside",
        REPO,
        (no(OUTSIDE, "init", "/tmp/escape-init"), no(OUTSIDE, "init", "../tmp/escape-init"),
         no(OUTSIDE, "clone", "/workspace", "/tmp/escape-clone"), no(OUTSIDE, "clone", ".", "../../tmp/escape-clone"),
         no(OUTSIDE, "clone", "file:///workspace", "/tmp/escape-clone"), no("'-C' is refused", "-C", "/tmp", "init"),
         no(OUTSIDE, "--git-dir=/tmp/escape-init/.git", "init")),
        control="git init -q /tmp/escape-init",
        leaves="test -e /tmp/escape-init",
        escapes=("/tmp/escape-init", "/tmp/escape-clone"),
    ),
    Attack(
        "format-patch-and-archive-outside-or-into-git",
        TWO,
        (no(OUTSIDE, "format-patch", "-o", "/tmp/escape-fp", "HEAD~1"),
         no(OUTSIDE, "format-patch", "-o/tmp/escape-fp", "HEAD~1"),
         no(OUTSIDE, "format-patch", "--output-directory=../../tmp/escape-fp", "HEAD~1"),
         no(OUTSIDE, "archive", "-o", "/tmp/escape-ar.tar", "HEAD"),
         no("'--output' is refused", "archive", "--output=x.tar", "HEAD"),
         no(r"\.git directory", "format-patch", "-o", ".git/hooks", "HEAD~1"),
         no(r"\.git directory", "-C", ".git", "format-patch", "-o", "hooks", "HEAD~1"),
         no(r"\.git directory", "archive", "-o", ".git/config", "HEAD")),
        control="git format-patch -q -o /tmp/escape-fp HEAD~1",
        leaves="test -e /tmp/escape-fp",
        escapes=("/tmp/escape-fp", "/tmp/escape-ar.tar"),
    ),
    Attack(
        "worktree-outside-or-into-git",
        REPO,
        (no(OUTSIDE, "worktree", "add", "/tmp/escape-wt"),
         no(OUTSIDE, "worktree", "add", "-b", "x", "../../tmp/escape-wt"),
         no(r"\.git directory", "worktree", "add", ".git/wt")),
        control="git worktree add -q /tmp/escape-wt",
        leaves="test -e /tmp/escape-wt",
        escapes=("/tmp/escape-wt",),
    ),
    Attack(
        "mv-a-tracked-file-over-the-config",
        REPO + "printf '[alias]\\n\\tx = !touch /tmp/pwned\\n' > evil.cfg; git add evil.cfg; git commit -qm cfg; ",
        (no(r"\.git directory", "mv", "-f", "evil.cfg", ".git/config"),
         no(r"\.git directory", "mv", "-f", "evil.cfg", "sub/.git"),
         no(r"\.git directory", "-C", ".git", "mv", "-f", "../evil.cfg", "config"),
         no("'x' is refused", "x")),
        control="git mv -f evil.cfg .git/config; git x",
    ),
    Attack(
        "work-tree-inside-git-dir",
        REPO + "printf '[alias]\\n\\tx = !touch /tmp/pwned\\n' > config; git add config; git commit -qm c; rm config; ",
        (no("'--work-tree' is refused", "--work-tree=.git", "checkout", "HEAD", "--", "config"),
         no("'--work-tree' is refused", "--work-tree", ".git/", "restore", "--source=HEAD", "config")),
        control="git --work-tree=.git checkout HEAD -- config && git x",
    ),
    Attack(
        "symlinks-lead-written-paths-into-git-or-out",
        TWO + "ln -s .git/hooks hk; ln -s /tmp tmplink; ",
        (no(r"\.git directory", "format-patch", "-o", "hk", "HEAD~1"),
         no("through a symlink", "format-patch", "-o", "tmplink/escape-fp", "HEAD~1"),
         no("through a symlink", "archive", "-o", "tmplink/escape-ar.tar", "HEAD"),
         no("through a symlink", "init", "tmplink/escape-init"),
         no(r"\.git directory", "clone", ".", "hk/x"),
         no("'-C' is refused", "-C", "tmplink", "status")),
        control="git format-patch -q -o hk HEAD~1",
        leaves="ls .git/hooks/0001-* > /dev/null 2>&1",
        escapes=("/tmp/escape-fp", "/tmp/escape-ar.tar", "/tmp/escape-init"),
    ),
    Attack(
        "format-patch-through-a-planted-symlink",
        TWO + "mkdir patches; ln -s /tmp/escape-patch patches/0001-two.patch; ",
        (no("holds symlinks", "format-patch", "-o", "patches", "HEAD~1"),
         no("holds symlinks", "format-patch", "--output-directory=patches", "HEAD~1")),
        control="git format-patch -q -o patches HEAD~1",
        leaves="test -e /tmp/escape-patch",
        escapes=("/tmp/escape-patch",),
    ),
    Attack(
        "clone-into-a-symlinked-empty-directory",
        REPO + "git clone -q --bare . src.git; mkdir /tmp/escape-empty; ln -s /tmp/escape-empty src; ",
        (no("through a symlink", "clone", "src.git"), no("through a symlink", "clone", "/workspace/src.git/")),
        control="git clone -q src.git",
        leaves="test -e /tmp/escape-empty/.git",
        escapes=("/tmp/escape-empty/.git",),
    ),
    Attack(
        "core-pager",
        REPO + "git config core.pager /workspace/payload; git config pager.log /workspace/payload; ",
        (ok("log"), ok("show"), no("'-p' is refused", "-p", "log"), no("'--paginate' is refused", "--paginate", "log")),
        control="script -qc 'git log' /dev/null > /dev/null",
    ),
    Attack(
        "core-fsmonitor",
        REPO + "git config core.fsmonitor /workspace/payload; echo more >> a.txt; ",
        (ok("status"), ok("diff"), ok("add", "a.txt"), ok("commit", "-m", "c")),
        control="echo again >> a.txt; git status",
    ),
    Attack(
        "hooks-in-dot-git",
        FEATURE + (
            "for h in pre-commit prepare-commit-msg commit-msg post-commit post-checkout post-merge pre-merge-commit "
            "reference-transaction post-rewrite pre-rebase pre-auto-gc post-index-change; do "
            "cp /workspace/payload .git/hooks/$h; done; "
        ),
        (ok("commit", "--allow-empty", "-m", "x"), ok("checkout", "-q", "-b", "other"), ok("checkout", "-q", "main"),
         ok("merge", "feature"), ok("merge", "--abort"), ok("commit", "--amend", "-m", "y"), ok("gc", "--auto")),
        control="git commit --allow-empty -qm control",
    ),
    Attack(
        "hooks-in-a-planted-git-dir",
        REPO + "cp -r .git evil; cp /workspace/payload evil/hooks/pre-commit; ",
        (no("'--git-dir' is refused", "--git-dir=evil", "--work-tree=.", "commit", "--allow-empty", "-m", "x"),
         no("'--git-dir' is refused", "--git-dir=/workspace/evil", "status"),
         no("'--separate-git-dir' is refused", "init", "--separate-git-dir=evil2", "sub"),
         no("'--separate-git-dir' is refused", "clone", "--separate-git-dir", "evil3", ".", "copy"),
         no("'--bare' is refused", "init", "--bare", "evil4"), no("'--bare' is refused", "--bare", "status")),
        control="git --git-dir=evil --work-tree=. commit --allow-empty -qm control",
    ),
    Attack(
        "hooks-path-in-config",
        REPO + "mkdir myhooks; cp /workspace/payload myhooks/pre-commit; "
        "git config core.hooksPath /workspace/myhooks; ",
        (ok("commit", "--allow-empty", "-m", "x"),
         no("'config core.hooksPath' is refused", "config", "core.hooksPath", "myhooks")),
        control="git commit --allow-empty -qm control",
    ),
    Attack(
        "filter-clean-and-smudge",
        REPO + (
            "echo '* filter=evil' > .gitattributes; git add .gitattributes; git commit -qm attrs; "
            "git config filter.evil.clean /workspace/payload; git config filter.evil.smudge /workspace/payload; "
            "echo changed > a.txt; "
        ),
        (ok("status"), ok("diff"), ok("add", "a.txt"), ok("commit", "-m", "c"),
         ok("checkout", "HEAD~1", "--", "a.txt"), ok("stash"), ok("stash", "pop")),
        control="echo again > a.txt; git add a.txt",
    ),
    Attack(
        "filter-process-required",
        REPO + (
            "echo '* filter=evil' > .gitattributes; git add .gitattributes; git commit -qm attrs; "
            "git config filter.evil.process /workspace/payload; git config filter.evil.required true; "
            "echo changed > a.txt; "
        ),
        (ok("add", "a.txt"), ok("commit", "-m", "c"), ok("checkout", "HEAD~1", "--", "a.txt")),
        control="echo again > a.txt; git add a.txt",
    ),
    Attack(
        "filter-with-a-mixed-case-name",
        REPO + (
            "echo '* filter=EviL' > .gitattributes; git add .gitattributes; git commit -qm attrs; "
            "git config filter.EviL.clean /workspace/payload; echo changed > a.txt; "
        ),
        (ok("add", "a.txt"), ok("status")),
        control="echo again > a.txt; git add a.txt",
    ),
    Attack(
        "diff-textconv",
        REPO + (
            "echo '* diff=evil' > .gitattributes; git add .gitattributes; git commit -qm attrs; "
            "git config diff.evil.textconv /workspace/payload; echo more >> a.txt; "
        ),
        (ok("diff"), ok("log", "-p", "-2"), ok("show", "HEAD~1"), ok("cat-file", "--textconv", "HEAD:a.txt"),
         ok("blame", "a.txt"), ok("grep", "--textconv", "hello"), ok("diff", "--textconv", "--stat")),
        control="git diff",
    ),
    Attack(
        "diff-external",
        REPO + "git config diff.external /workspace/payload; echo more >> a.txt; ",
        (ok("diff"), ok("diff", "--ext-diff"), ok("log", "-p", "--ext-diff", "-1"), ok("show", "--ext-diff")),
        control="git diff",
    ),
    Attack(
        "diff-driver-command",
        REPO + (
            "echo '* diff=evil' > .gitattributes; git add .gitattributes; git commit -qm attrs; "
            "git config diff.evil.command /workspace/payload; echo more >> a.txt; "
        ),
        (ok("diff"), ok("diff", "--ext-diff"), ok("show", "--ext-diff", "HEAD")),
        control="git diff",
    ),
    Attack(
        "merge-driver",
        REPO + (
            "echo 'a.txt merge=evil' > .gitattributes; git add .gitattributes; git commit -qm attrs; "
            "git checkout -qb feature; echo feature > a.txt; git commit -qam feature; git checkout -q main; "
            "echo main > a.txt; git commit -qam main; git config merge.evil.driver /workspace/payload; "
        ),
        (ok("merge", "feature"), ok("merge", "--abort"), ok("cherry-pick", "feature"), ok("cherry-pick", "--abort")),
        control="git merge feature",
    ),
    Attack(
        "merge-default-driver",
        FEATURE + "git config merge.default evil; git config merge.evil.driver /workspace/payload; ",
        (ok("merge", "feature"), ok("merge", "--abort")),
        control="git merge feature",
    ),
    Attack(
        "core-sshcommand-with-an-ssh-url",
        REPO + "git config core.sshCommand /workspace/payload; git remote add origin ssh://example.com/repo.git; ",
        (ok("fetch", "origin"), ok("ls-remote", "ssh://git@example.com/x"), ok("push", "origin", "main"),
         ok("pull", "origin", "main")),
        control="git ls-remote origin",
    ),
    Attack(
        "ext-url",
        REPO + "git config protocol.ext.allow always; git remote add origin 'ext::sh -c touch% /tmp/pwned'; ",
        (ok("fetch", "origin"), ok("ls-remote", "origin"), ok("pull", "origin"),
         no("ext:: and fd::", "clone", "ext::sh -c touch% /tmp/pwned", "x"),
         no("ext:: and fd::", "remote", "add", "o2", "EXT::sh -c touch% /tmp/pwned")),
        control="git fetch origin",
    ),
    Attack(
        "url-insteadof-rewriting-to-ext",
        REPO + (
            "git config protocol.ext.allow always; git config protocol.allow always; "
            "git config 'url.ext::sh -c touch% /tmp/pwned% #.insteadOf' https://example.com/; "
        ),
        (ok("fetch", "https://example.com/repo"), ok("ls-remote", "https://example.com/repo"),
         ok("clone", "https://example.com/repo", "copy")),
        control="git ls-remote https://example.com/repo",
    ),
    Attack(
        "remote-vcs-helper-alias",
        REPO + (
            "git remote add origin /nonexistent; git config remote.origin.vcs evil; "
            "git config protocol.evil.allow always; git config alias.remote-evil '!touch /tmp/pwned'; "
        ),
        (ok("fetch", "origin"), ok("ls-remote", "origin"), ok("remote", "update")),
        control="git fetch origin",
    ),
    Attack(
        "remote-uploadpack-in-config",
        REPO + (
            "git clone -q . /workspace/other; git remote add origin /workspace/other; "
            "git config remote.origin.uploadpack '/workspace/payload; git-upload-pack'; "
        ),
        (no("remote.origin.uploadpack", "fetch", "origin"), no("remote.origin.uploadpack", "status"),
         ok("config", "--unset", "remote.origin.uploadpack"), ok("fetch", "origin")),
        control="git config remote.origin.uploadpack '/workspace/payload; git-upload-pack'; git fetch origin",
    ),
    Attack(
        "remote-receivepack-in-config",
        REPO + (
            "git init -q --bare /workspace/remote.git; git remote add origin /workspace/remote.git; "
            "git config remote.origin.receivepack '/workspace/payload; git-receive-pack'; "
        ),
        (no("remote.origin.receivepack", "push", "origin", "main"),),
        control="git push -q origin main",
    ),
    Attack(
        "upload-pack-and-receive-pack-options",
        REPO + "git remote add origin /workspace; ",
        (no("'--upload-pack' is refused", "fetch", "--upload-pack=/workspace/payload", "origin"),
         no("'-u' is refused", "clone", "-u", "/workspace/payload", ".", "copy"),
         no("'--upload-pack' is refused", "ls-remote", "--upl=/workspace/payload", "."),
         no("'--upload-pack' is refused", "pull", "--upload-pack", "/workspace/payload"),
         no("'--receive-pack' is refused", "push", "--receive-pack=/workspace/payload", "origin", "main"),
         no("'--exec' is refused", "push", "--exec=/workspace/payload", "origin", "main")),
        control="git ls-remote --upload-pack=/workspace/payload .",
    ),
    Attack(
        "local-push-runs-the-other-repository-hooks",
        REPO + (
            "git init -q --bare /workspace/remote.git; cp /workspace/payload /workspace/remote.git/hooks/pre-receive; "
            "git -C /workspace/remote.git config core.alternateRefsCommand /workspace/payload; "
            "git remote add origin /workspace/remote.git; "
        ),
        (ok("push", "origin", "main"), ok("push", "/workspace/remote.git", "main"), ok("fetch", "origin"),
         ok("clone", "/workspace/remote.git", "copy")),
        control="git push -q origin main",
    ),
    Attack(
        "rebase-exec",
        TWO,
        (no("'--exec' is refused", "rebase", "--exec", "/workspace/payload", "HEAD~1"),
         no("'-x' is refused", "rebase", "-x", "/workspace/payload", "HEAD~1"),
         no("'-x' is refused", "rebase", "-ix/workspace/payload", "HEAD~1"),
         no("'--exec' is refused", "rebase", "--exe=/workspace/payload", "HEAD~1")),
        control="git rebase -q --exec /workspace/payload HEAD~1",
    ),
    Attack(
        "credential-helper",
        REPO + HTTP_SERVER + (
            "git config credential.helper '!touch /tmp/pwned'; "
            "git config credential.http://127.0.0.1:8765.helper '!touch /tmp/pwned'; "
            "git remote add origin http://127.0.0.1:8765/auth/repo.git; "
        ),
        (ok("fetch", "origin"), ok("ls-remote", "http://127.0.0.1:8765/auth/other.git"),
         no("'credential' is refused", "credential", "fill"),
         no("'config credential.helper' is refused", "config", "credential.helper", "store")),
        control="git fetch -q origin",
    ),
    Attack(
        "http-cookie-jar-written-outside",
        REPO + HTTP_SERVER + (
            "git config http.cookieFile /tmp/escape-cookies; "
            "git config http.http://127.0.0.1:8765/.saveCookies true; "
            "git remote add origin http://127.0.0.1:8765/repo.git; "
        ),
        (ok("ls-remote", "origin"), ok("fetch", "origin"),
         no("'config http.saveCookies' is refused", "config", "http.saveCookies", "true")),
        control="git ls-remote origin",
        leaves="test -e /tmp/escape-cookies",
        escapes=("/tmp/escape-cookies",),
    ),
    Attack(
        "gpg-program-for-signing-and-verifying",
        REPO + (
            "git config gpg.program /workspace/payload; git config gpg.ssh.program /workspace/payload; "
            "git config gpg.x509.program /workspace/payload; git config commit.gpgSign true; "
            "git config log.showSignature true; "
        ),
        (ok("commit", "-S", "--allow-empty", "-m", "signed"), ok("commit", "--allow-empty", "-m", "auto-signed"),
         ok("log", "--show-signature", "-1"), ok("log", "--format=%G?", "-1"), ok("tag", "-s", "-m", "t", "v1"),
         ok("merge", "--verify-signatures", "HEAD"), no("'verify-commit' is refused", "verify-commit", "HEAD")),
        control="git commit -S --allow-empty -qm control",
    ),
    Attack(
        "core-editor",
        REPO + "git config core.editor /workspace/payload; ",
        (ok("commit", "--allow-empty"), ok("commit", "--amend"), ok("commit", "--allow-empty", "-e", "-m", "x"),
         ok("tag", "-a", "v1"), ok("branch", "--edit-description"), ok("notes", "add")),
        control="git commit --allow-empty",
    ),
    Attack(
        "sequence-editor",
        TWO + "git config sequence.editor /workspace/payload; ",
        (ok("rebase", "-i", "HEAD~1"), ok("rebase", "--abort")),
        control="git rebase -i HEAD~1",
    ),
    Attack(
        "core-worktree-outside",
        REPO + "mkdir /tmp/escape-wt; git config core.worktree /tmp/escape-wt; ",
        (no("work tree", "checkout", "-f", "HEAD", "--", "a.txt"), no("work tree", "status"),
         no("work tree", "reset", "--hard")),
        control="git checkout -f HEAD -- a.txt",
        leaves="test -e /tmp/escape-wt/a.txt",
        escapes=("/tmp/escape-wt/a.txt",),
    ),
    Attack(
        "core-worktree-inside-git-dir",
        REPO + "git config core.worktree hooks; ",
        (no(r"lies in a \.git directory", "checkout", "-f", "HEAD", "--", "a.txt"),),
        control="git checkout -f HEAD -- a.txt",
        leaves="test -e .git/hooks/a.txt",
        escapes=("/workspace/.git/hooks/a.txt",),
    ),
    Attack(
        "include-path-of-a-planted-file",
        REPO + "printf '[core]\\n\\tfsmonitor = /workspace/payload\\n' > inc.cfg; "
        "git config include.path /workspace/inc.cfg; ",
        (no("'include.path' is refused", "status"), no("'include.path' is refused", "log")),
        control="git status",
    ),
    Attack(
        "include-if-onbranch",
        REPO + (
            "printf '[core]\\n\\tfsmonitor = /workspace/payload\\n' > inc.cfg; "
            "git config includeIf.onbranch:main.path /workspace/inc.cfg; "
        ),
        (no("'includeif.onbranch:main.path' is refused", "status"),),
        control="git status",
    ),
    Attack(
        "trailer-command",
        REPO + "git config trailer.sign.key 'Signed: '; git config trailer.sign.command /workspace/payload; ",
        (ok("commit", "--allow-empty", "-m", "x", "--trailer", "sign: me"),
         no("'interpret-trailers' is refused", "interpret-trailers", "--trailer", "sign: me")),
        control="git commit --allow-empty -qm c --trailer 'sign: me'",
    ),
    Attack(
        "bisect-run-and-view",
        TWO + "git config alias.evilview '!touch /tmp/pwned; :'; ",
        (ok("bisect", "start", "HEAD", "HEAD~1"), no("'bisect run' is refused", "bisect", "run", "/workspace/payload"),
         no("'bisect view evilview' is refused", "bisect", "view", "evilview"),
         no("'bisect visualize tig' is refused", "bisect", "visualize", "tig"), ok("bisect", "reset")),
        control="git bisect start HEAD HEAD~1; git bisect view evilview",
    ),
    Attack(
        "submodule-foreach-and-update-command",
        REPO + (
            "git init -q -b main /workspace/subsrc; "
            "git -C /workspace/subsrc -c user.name=A -c user.email=a@example.com commit -q --allow-empty -m s; "
            "git -c protocol.file.allow=always submodule add -q /workspace/subsrc sub; git commit -qm sub; "
            "git submodule deinit -f sub > /dev/null; git config submodule.sub.update '!/workspace/payload'; "
        ),
        (no("'submodule foreach' is refused", "submodule", "foreach", "/workspace/payload"),
         no("'submodule' is refused", "submodule", "update", "--init"),
         no("'--recurse-submodules' is refused", "clone", "--recurse-submodules", ".", "copy"),
         no("'--recurse-submodules' is refused", "checkout", "--recurse-submodules", "main"),
         no("'--recursive' is refused", "clone", "--recursive", ".", "copy"),
         no("'--submodule' is refused", "diff", "--submodule=diff")),
        control="git -c protocol.file.allow=always submodule update --init",
    ),
    Attack(
        "difftool-and-mergetool",
        REPO + "git config diff.tool evil; git config difftool.evil.cmd /workspace/payload; echo more >> a.txt; ",
        (no("'difftool' is refused", "difftool", "-y"), no("'mergetool' is refused", "mergetool"),
         no("'config difftool.evil.cmd' is refused", "config", "difftool.evil.cmd", "x")),
        control="git difftool -y",
    ),
    Attack(
        "exec-path",
        REPO + "mkdir bin; cp /workspace/payload bin/git-evilcmd; cp /workspace/payload bin/git-merge-evil; ",
        (no("'--exec-path' is refused", "--exec-path=/workspace/bin", "evilcmd"),
         no("'--exec-path' is refused", "--exec-path", "/workspace/bin", "status"),
         no("'-s evil' is refused", "merge", "-s", "evil", "HEAD"),
         no("'--strategy ../bin/evil' is refused", "merge", "--strategy=../bin/evil", "HEAD")),
        control="git --exec-path=/workspace/bin evilcmd",
    ),
    Attack(
        "dash-c-and-config-env",
        REPO,
        (no("'-c' is refused", "-c", "core.fsmonitor=/workspace/payload", "status"),
         no("'-c' is refused", "-c", "alias.x=!touch /tmp/pwned", "x"),
         no("'--config-env' is refused", "--config-env=core.fsmonitor=PAYLOAD", "status"),
         no("'-c' is refused", "clone", "-c", "core.fsmonitor=/workspace/payload", ".", "copy"),
         no("'--config' is refused", "clone", "--config", "core.fsmonitor=/workspace/payload", ".", "copy"),
         no("'--template' is refused", "clone", "--template=/workspace", ".", "copy")),
        control="git -c core.fsmonitor=/workspace/payload status",
    ),
    Attack(
        "config-writes-an-alias",
        REPO + "git config foo.x '!touch /tmp/pwned'; ",
        (no("'config alias.x' is refused", "config", "alias.x", "!touch /tmp/pwned"),
         no("'config alias.x' is refused", "config", "--add", "alias.x", "!touch /tmp/pwned"),
         no("'config Alias.X' is refused", "config", "--local", "Alias.X", "!touch /tmp/pwned"),
         no("'config --rename-section alias' is refused", "config", "--rename-section", "foo", "alias"),
         no("'x' is refused", "x")),
        control="git config --rename-section foo alias; git x",
    ),
    Attack(
        "unknown-subcommand-is-an-alias",
        REPO + "git config alias.st '!touch /tmp/pwned'; ",
        (no(r"'st' is refused: .*allowed: add, annotate, apply", "st"), no("'frobnicate' is refused", "frobnicate"),
         no("'bundle' is refused", "bundle", "create", "/workspace/b", "--all")),
        control="git st",
    ),
    Attack(
        "tar-format-command",
        REPO + "git config tar.evil.command /workspace/payload; git config tar.tgz.command /workspace/payload; ",
        (ok("archive", "--format=evil", "-o", "out.evil", "HEAD"),
         ok("archive", "--format=tgz", "-o", "out.tgz", "HEAD"), ok("archive", "-o", "out.tar.gz", "HEAD"),
         no("'--remote' is refused", "archive", "--remote=.", "HEAD")),
        control="git archive --format=evil HEAD > /dev/null",
    ),
    Attack(
        "alternate-refs-command",
        REPO + (
            "git clone -q --shared . shared; git -C shared config core.alternateRefsCommand /workspace/payload; "
            "echo two > a.txt; git commit -qam two; "
        ),
        (ok("-C", "shared", "fetch", "origin"), ok("-C", "shared", "pull", "--ff-only")),
        control="echo three > a.txt; git commit -qam three; git -C shared fetch -q origin",
    ),
    Attack(
        "grep-open-files-in-pager",
        REPO,
        (no("'-O' is refused", "grep", "-O/workspace/payload", "hello"),
         no("'--open-files-in-pager' is refused", "grep", "--open-files-in-pager=/workspace/payload", "hello")),
        control="git grep -O/workspace/payload hello",
    ),
    Attack(
        "help-viewer",
        REPO + "git config help.format web; git config web.browser evil; "
        "git config browser.evil.cmd /workspace/payload; ",
        (no("documentation viewer", "help", "log"), no("documentation viewer", "log", "--help"),
         no("documentation viewer", "--help"), ok("help", "-a")),
    ),
    Attack(
        "namespace-and-other-global-options",
        REPO,
        (no("'--namespace' is refused", "--namespace=x", "status"),
         no("'--super-prefix' is refused", "--super-prefix=x/", "status"),
         no("'--list-cmds' is refused", "--list-cmds=main"),
         no("not a global option", "--frobnicate", "status")),
    ),
]  # fmt: skip


@dataclass
class Box:
    """The module's gVisor workspace and the tools of one session on it."""

    provider: GVisorProvider
    workspace_id: str
    tools: Toolbox

    async def run(self, script: str) -> int:
        """Run a shell script as root in /workspace with plain git (no protections); return its exit code."""
        result = await self.provider.exec(self.workspace_id, ExecRequest(script, timeout_s=60))
        return result.exit_code

    async def sh(self, script: str) -> None:
        """Run a setup script and insist that it succeeds."""
        result = await self.provider.exec(self.workspace_id, ExecRequest(script, timeout_s=60))
        assert result.exit_code == 0, (script, result.stdout.decode(), result.stderr.decode())

    async def existing(self, paths: tuple[str, ...]) -> list[str]:
        """Which of these paths exist (checked with a plain exec, not through any tool)."""
        request = ExecRequest(
            "sh", ("-c", 'for p in "$@"; do test -e "$p" && echo "$p"; done; true', "sh", *paths), mode=ExecMode.ARGV
        )
        result = await self.provider.exec(self.workspace_id, request)
        return result.stdout.decode().split()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def box() -> AsyncIterator[Box]:
    """One isolated gVisor workspace for the whole corpus (each vector cleans up after itself)."""
    engine = DockerEngine(DOCKER_SOCKET)
    try:
        await engine.ping()
        if not await engine.image_exists(BASE_IMAGE):
            pytest.skip(f"base image {BASE_IMAGE} is missing; run `make bootstrap`")
    except DockerAPIError as exc:
        pytest.skip(f"Docker engine not reachable: {exc}")
    finally:
        await engine.aclose()
    provider = GVisorProvider(DockerEngine(DOCKER_SOCKET))
    workspace_id = f"t{uuid.uuid4().hex[:15]}"
    try:
        await provider.create(WorkspaceSpec(id=workspace_id, image=BASE_IMAGE, network="isolated"))
        yield Box(provider, workspace_id, Toolbox(provider, workspace_id, session_id="git-vectors"))
    finally:
        await provider.destroy(workspace_id)
        await provider.aclose()


@pytest_asyncio.fixture(loop_scope="module")
async def clean(box: Box) -> AsyncIterator[Box]:
    """The workspace, emptied (with the markers, escapes and any helper server) after the test."""
    yield box
    await box.sh(
        "if test -f /tmp/srv.pid; then kill $(cat /tmp/srv.pid) 2>/dev/null || true; fi; "
        "rm -rf /workspace/* /workspace/.[!.]* /tmp/pwned /tmp/escape-* /tmp/srv.py /tmp/srv.pid /etc/corral-escape"
    )


async def test_the_corpus_is_large_enough() -> None:
    """The corpus holds at least 30 distinct vectors, each with a unique name."""
    assert len(ATTACKS) >= 30
    assert len({attack.name for attack in ATTACKS}) == len(ATTACKS)


@pytest.mark.parametrize("attack", ATTACKS, ids=[attack.name for attack in ATTACKS])
async def test_git_vector_is_refused_or_harmless(clean: Box, attack: Attack) -> None:
    """Through the git tool the vector is refused or runs and writes nothing, while plain git (the control) runs it."""
    await clean.sh(PRELUDE + attack.setup + "true")
    for path, content in attack.writes:
        await clean.tools.write({"path": path, "content": content})
    for args, refusal in attack.calls:
        if refusal is None:
            await clean.tools.git({"args": list(args)})
        else:
            with pytest.raises(ToolError, match=refusal):
                await clean.tools.git({"args": list(args)})
    assert await clean.existing(("/tmp/pwned", "/workspace/pwned", *attack.escapes)) == []
    if attack.control is not None:
        await clean.run(attack.control)
        assert await clean.run(attack.leaves) == 0, f"the control did not show the vector: {attack.control}"


async def test_legitimate_work_still_runs(clean: Box) -> None:
    """init, identity, add, commit, log, diff, branch, checkout, merge, stash, tag, worktree, clone and fetch of a
    repository inside /workspace, format-patch and archive into the workspace all succeed through the tool."""
    git = clean.tools.git
    steps: list[list[str]] = [
        ["init", "-q", "-b", "main", "proj"],
        ["-C", "proj", "config", "user.name", "Agent"],
        ["-C", "proj", "config", "user.email", "agent@example.com"],
    ]
    for args in steps:
        assert (await git({"args": args}))["exit_code"] == 0, args
    await clean.tools.write({"path": "proj/a.txt", "content": "one /usr/bin\n"})
    steps = [
        ["-C", "proj", "add", "a.txt"],
        ["-C", "proj", "commit", "-q", "-m", "/one: a message starting with a slash"],
        ["-C", "proj", "checkout", "-q", "-b", "feature"],
    ]
    for args in steps:
        assert (await git({"args": args}))["exit_code"] == 0, args
    await clean.tools.write({"path": "proj/b.txt", "content": "two\n"})
    steps = [
        ["-C", "proj", "add", "b.txt"],
        ["-C", "proj", "commit", "-q", "-m", "two"],
        ["-C", "proj", "checkout", "-q", "main"],
        ["-C", "proj", "merge", "-q", "--no-edit", "feature"],
        ["-C", "proj", "log", "--oneline", "main..feature"],
        ["-C", "proj", "diff", "HEAD~1", "--stat"],
        ["-C", "proj", "branch", "-a"],
        ["-C", "proj", "tag", "-a", "v1", "-m", "release"],
        ["-C", "proj", "grep", "/usr/bin"],
        ["-C", "proj", "stash", "list"],
        ["-C", "proj", "worktree", "add", "-q", "../wt", "feature"],
        ["-C", "wt", "status", "--short"],
        ["clone", "-q", "proj", "copy"],
        ["clone", "-q", "/workspace/proj/.git", "copy2"],
        ["-C", "copy", "fetch", "-q", "origin"],
        ["-C", "copy", "pull", "-q", "--ff-only"],
        ["-C", "proj", "format-patch", "-q", "-o", "../patches", "HEAD~1"],
        ["-C", "proj", "archive", "-o", "../proj.tar.gz", "HEAD"],
        ["-C", "proj", "mv", "b.txt", "c.txt"],
        ["-C", "proj", "rm", "-q", "--cached", "c.txt"],
        ["--git-dir=/workspace/proj/.git", "--work-tree=/workspace/proj", "status", "--short"],
    ]
    for args in steps:
        result = await git({"args": args})
        assert result["exit_code"] == 0, (args, result)
    log = await git({"args": ["-C", "copy", "log", "--format=%s", "-1", "HEAD~1"]})
    assert log["stdout"] == "/one: a message starting with a slash\n"
    assert await clean.existing(("/workspace/patches", "/workspace/proj.tar.gz", "/workspace/wt/b.txt")) == [
        "/workspace/patches",
        "/workspace/proj.tar.gz",
        "/workspace/wt/b.txt",
    ]


async def test_neutralised_settings_are_named_and_git_still_works(clean: Box) -> None:
    """A hostile filter and textconv are switched off: add stores the file as it is, and stderr names the keys."""
    await clean.sh(
        PRELUDE + REPO + "echo '* filter=evil diff=evil' > .gitattributes; git add .gitattributes; git commit -qm a; "
        "git config filter.evil.clean /workspace/payload; git config diff.evil.textconv /workspace/payload; "
        "echo changed > a.txt"
    )
    added = await clean.tools.git({"args": ["add", "a.txt"]})
    assert added["exit_code"] == 0, added
    assert "filter.evil.clean" in str(added["stderr"]) and "diff.evil.textconv" in str(added["stderr"])
    shown = await clean.tools.git({"args": ["show", ":a.txt"]})
    assert shown["stdout"] == "changed\n"
    assert await clean.existing(("/tmp/pwned",)) == []


async def test_a_clean_repository_gets_no_note(clean: Box) -> None:
    """Without dangerous settings git's own output comes back untouched."""
    await clean.sh(REPO + "true")
    assert await clean.tools.git({"args": ["status", "--short"]}) == {"exit_code": 0, "stdout": "", "stderr": ""}
