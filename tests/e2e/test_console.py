"""The web console at ``/`` in a real headless Chromium against a real ``corral serve`` on gVisor.

A new user signs in (a wrong token is refused first), creates a workspace, types ``echo hi`` in its terminal (xterm.js
over the PTY WebSocket), uploads a file and sees it with ``ls``, downloads it back, watches a session's audit log
pick up a tool call, and destroys the workspace; every request the browser makes goes to the loopback server.

Screenshots of each step go to ``test-artifacts/console/`` in the repository (or ``$CORRAL_TEST_ARTIFACTS/console``).
"""

from __future__ import annotations

import re
import secrets
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.conftest import BASE_IMAGE
from tests.e2e.conftest import ARTIFACTS, TOKEN, Server, start_server, stop_server

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ARTIFACTS / "console"
WORKSPACES = "/api/v1/agent/workspaces"


@pytest.fixture(scope="module")
def gvisor_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server on gVisor; skips (a failure under CI) without the base image."""
    if subprocess.run(["docker", "image", "inspect", BASE_IMAGE], capture_output=True, check=False).returncode != 0:
        pytest.skip(f"Docker engine or base image {BASE_IMAGE} not available; run `make bootstrap`")
    server = start_server(tmp_path_factory.mktemp("console"), {"CORRAL_PROVIDERS": "gvisor"})
    try:
        yield server
    finally:
        stop_server(server)


class Browsing:
    """A page on the console that records every URL it asks for, refuses those off the server, and keeps errors."""

    def __init__(self, browser: Any, server: Server, shots: str) -> None:
        self.origin = urlsplit(server.url).netloc
        self.urls: list[str] = []
        self.outside: list[str] = []
        self.errors: list[str] = []
        self.shots = SHOTS / shots
        self.shots.mkdir(parents=True, exist_ok=True)
        self.context = browser.new_context(viewport={"width": 1360, "height": 900}, accept_downloads=True)
        self.page = self.context.new_page()
        self.page.route("**/*", self._only_loopback)
        self.page.on("request", lambda request: self.urls.append(request.url))
        self.page.on("websocket", lambda socket: self.urls.append(socket.url))
        self.page.on("pageerror", lambda error: self.errors.append(f"page error: {error}"))
        self.page.on(
            "console",
            lambda message: (
                self.errors.append(f"console {message.type}: {message.text}") if message.type == "error" else None
            ),
        )
        self.page.on("dialog", lambda dialog: dialog.accept())  # the console confirms destroy and delete

    def _only_loopback(self, route: Any) -> None:
        url = route.request.url
        if urlsplit(url).scheme in ("data", "blob") or urlsplit(url).netloc == self.origin:
            route.continue_()
        else:
            self.outside.append(url)
            route.abort()

    def shot(self, name: str) -> None:
        """Save a screenshot of the page as it is now."""
        self.page.screenshot(path=str(self.shots / f"{name}.png"))

    def off_loopback(self) -> list[str]:
        """Every URL asked for that is not on the server's loopback address and port."""
        return [
            url
            for url in self.urls
            if urlsplit(url).scheme not in ("data", "blob")
            and not (urlsplit(url).hostname == "127.0.0.1" and urlsplit(url).netloc == self.origin)
        ]


def _poll(check: Callable[[], Any], what: str, timeout_s: float = 30) -> Any:
    """Poll ``check`` until it returns something truthy, failing with ``what`` after the deadline."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what}: not seen within {timeout_s} s")


def _terminal_text(page: Any) -> str:
    """The text xterm.js shows (its DOM renderer's rows)."""
    return str(page.locator("#terminal .xterm-rows").inner_text())


def _type_in_terminal(page: Any, line: str) -> None:
    """Type a command line once the shell's prompt shows (typed earlier, it would be echoed before the prompt)."""
    _poll(lambda: re.search(r"[#$] *$", _terminal_text(page).rstrip("\n\xa0 ")), "the shell's prompt")
    page.locator("#terminal .xterm-helper-textarea").focus()
    page.keyboard.type(line)
    page.keyboard.press("Enter")


def _start_session(server: Server) -> dict[str, Any]:
    """An active session of a new agent type with the bash tool, on gVisor."""
    created = server.client.post(
        "/api/v1/agent-types",
        json={
            "name": f"console-{secrets.token_hex(4)}",
            "workspace": {"enabled": True, "provider": "gvisor", "repo_source": {"type": "none"}, "tools": ["bash"]},
        },
    )
    assert created.status_code == 201, created.text
    started = server.client.post("/api/v1/agent/sessions", json={"agent_type_id": created.json()["id"]})
    assert started.status_code == 201, started.text
    session_id = started.json()["id"]

    def active() -> dict[str, Any] | None:
        session: dict[str, Any] = server.client.get(f"/api/v1/agent/sessions/{session_id}").json()
        return session if session["status"] != "provisioning" else None

    session: dict[str, Any] = _poll(active, f"session {session_id} leaving provisioning", 120)
    assert session["status"] == "active", session
    return session


def test_console_sign_in_terminal_files_audit_and_destroy_over_loopback_only(
    gvisor_server: Server, chromium: Any
) -> None:
    """In headless Chromium a new user is refused with a wrong token and signed in with the right one, creates a
    workspace, runs ``echo hi`` in its terminal and sees ``hi``, uploads a file and sees it with ``ls``, downloads the
    same bytes back, sees a session's tool call appear in its audit log, and destroys the workspace, while every
    request stays on the loopback server and the page's strict CSP is never violated."""
    server = gvisor_server
    browsing = Browsing(chromium, server, "flow")
    page = browsing.page
    try:
        # Sign in: a wrong token is refused with a message, the right one opens the workspaces page.
        page.goto(f"{server.url}/")
        page.locator("#token").wait_for()
        browsing.shot("01-login")
        page.fill("#token", "not-the-token")
        page.click("#login-form button[type=submit]")
        page.locator("#login-error").wait_for()
        assert "refused" in page.locator("#login-error").inner_text()
        browsing.shot("02-login-wrong-token")
        assert page.evaluate("sessionStorage.getItem('corral.token')") is None
        page.fill("#token", TOKEN)
        page.click("#login-form button[type=submit]")
        page.locator("h1", has_text="Workspaces").wait_for()
        assert page.evaluate("sessionStorage.getItem('corral.token')") == TOKEN

        # Create: the label is markup on purpose, and must show as text (the console never parses API strings).
        page.click("#new-workspace")
        page.locator("#create-form").wait_for()
        page.select_option("#create-provider", "gvisor")
        page.fill("#create-name", "<b>console</b> test")
        browsing.shot("03-create-form")
        page.click("#create-submit")
        row = page.locator("#workspaces-table tr[data-status=ready]").first
        row.wait_for(timeout=120_000)
        workspace_id = row.get_attribute("data-workspace-id")
        assert workspace_id
        assert row.locator(".label").inner_text() == "<b>console</b> test"
        assert row.locator("b").count() == 0
        assert "gvisor" in row.inner_text()
        # The idle timeout (an hour by default) shows quietly; within five minutes of striking it is a warning.
        assert re.fullmatch(r"idle timeout in (59|60) min", row.locator(".idle-note").inner_text())
        soon = page.evaluate(
            """async () => {
                const { expiry } = await import("/console/static/dom.js");
                const el = expiry(new Date(Date.now() + 240_000).toISOString());
                return [el.className, el.textContent];
            }"""
        )
        assert "idle-warning" in soon[0] and re.fullmatch(r"⏱ stops in 4 min unless used", soon[1]), soon
        page.locator("#workspaces-table .usage").first.wait_for(timeout=30_000)  # resource use from the metrics API
        browsing.shot("04-workspace-ready")

        # Terminal: `echo hi` prints hi on a line of its own.
        row.locator("a[data-action=terminal]").click()
        page.locator("#terminal-state[data-kind=ok]").wait_for(timeout=30_000)
        _type_in_terminal(page, "echo hi")
        _poll(lambda: re.search(r"^hi\s*$", _terminal_text(page), re.MULTILINE), "`hi` in the terminal")
        # xterm's theme reached the page (its <style> elements are allowed by the CSP).
        assert page.eval_on_selector("#terminal .xterm-rows", "e => getComputedStyle(e).color") == "rgb(226, 232, 240)"
        browsing.shot("05-terminal-echo-hi")

        # Resize: a smaller window refits the terminal, and the shell is told its new size.
        before_size = page.get_attribute("#terminal", "data-size")
        page.set_viewport_size({"width": 1000, "height": 700})
        size = _poll(
            lambda: (s := page.get_attribute("#terminal", "data-size")) != before_size and s, "the terminal refitted"
        )
        rows, cols = size.split("x")
        _type_in_terminal(page, "stty size")
        _poll(lambda: re.search(rf"^{rows} {cols}\s*$", _terminal_text(page), re.MULTILINE), f"`stty size` {size}")
        browsing.shot("05b-terminal-resized")
        page.set_viewport_size({"width": 1360, "height": 900})

        # Files: upload a file, then see it with `ls` in the terminal.
        payload = secrets.token_bytes(300_000) + b"\x00\xff end"
        page.click("#tab-files")
        page.locator("#files-table table").wait_for()
        page.set_input_files(
            "#upload-input",
            files=[{"name": "console-upload.bin", "mimeType": "application/octet-stream", "buffer": payload}],
        )
        page.locator("#files-table tr[data-name='console-upload.bin']").wait_for(timeout=30_000)
        assert "Uploaded /workspace/console-upload.bin" in page.locator("#files-status").inner_text()
        browsing.shot("06-files-uploaded")
        page.click("#tab-terminal")
        page.locator("#terminal-state[data-kind=ok]").wait_for(timeout=30_000)
        _type_in_terminal(page, "ls -l /workspace")
        _poll(lambda: "console-upload.bin" in _terminal_text(page), "console-upload.bin in `ls`")
        assert re.search(r"\b300006\b.*console-upload\.bin", _terminal_text(page)), _terminal_text(page)
        browsing.shot("07-terminal-ls")

        # Download it back: the same bytes.
        page.click("#tab-files")
        target = page.locator("#files-table tr[data-name='console-upload.bin']")
        with page.expect_download() as download_info:
            target.locator("button[data-action=download]").click()
        saved = Path(download_info.value.path())
        assert download_info.value.suggested_filename == "console-upload.bin"
        assert saved.read_bytes() == payload
        page.locator("#files-status .notice-ok").wait_for()
        browsing.shot("08-files-downloaded")

        # Sessions: a tool call made through the API appears in the session's live audit log.
        session = _start_session(server)
        page.goto(f"{server.url}/#/sessions")
        page.locator(f"#sessions-table tr[data-session-id='{session['id']}'], #sessions-table .notice").first.wait_for()
        browsing.shot("09-sessions")
        page.goto(f"{server.url}/#/sessions/{session['id']}")
        page.locator("#audit-log table").wait_for()
        before = page.locator("#audit-log tr[data-tool=bash]").count()
        called = server.client.post(
            f"/api/v1/agent/sessions/{session['id']}/tools/bash", json={"command": "echo audited-from-console-test"}
        )
        assert called.status_code == 200, called.text
        _poll(lambda: page.locator("#audit-log tr[data-tool=bash]").count() > before, "the bash call in the audit log")
        assert "audited-from-console-test" in page.locator("#audit-log tr[data-tool=bash]").first.inner_text()
        browsing.shot("10-session-audit")
        assert server.client.delete(f"/api/v1/agent/sessions/{session['id']}").status_code == 200

        # Providers and pools.
        page.click("nav.nav a[href='#/providers']")
        page.locator("#providers-table tr[data-provider=gvisor]").wait_for()
        assert "healthy" in page.locator("#providers-table tr[data-provider=gvisor]").inner_text()
        browsing.shot("11-providers")

        # Destroy: the row goes, and so does the workspace.
        page.click("nav.nav a[href='#/workspaces']")
        ours = page.locator(f"#workspaces-table tr[data-workspace-id='{workspace_id}']")
        ours.locator("button[data-action=destroy]").click()
        ours.wait_for(state="detached", timeout=60_000)
        assert server.client.get(f"{WORKSPACES}/{workspace_id}").json()["status"] == "destroyed"
        browsing.shot("12-destroyed")
    finally:
        browsing.shot("last")
        browsing.context.close()
    assert browsing.urls, "no request was recorded"
    assert browsing.outside == [] and browsing.off_loopback() == [], browsing.off_loopback()
    assert any(urlsplit(url).scheme == "ws" and urlsplit(url).path.endswith("/pty") for url in browsing.urls)
    failures = [e for e in browsing.errors if "Content Security Policy" in e or "page error" in e]
    assert failures == [], "\n".join(browsing.errors)


def test_console_without_assets_says_to_run_make_bootstrap(tmp_path: Path, chromium: Any) -> None:
    """With CORRAL_WEB_ASSETS_DIR empty the console still signs in, and both its banner and the terminal say to run
    `make bootstrap` instead of showing a blank page."""
    server = start_server(
        tmp_path / "server", {"CORRAL_PROVIDERS": "fake", "CORRAL_WEB_ASSETS_DIR": str(tmp_path / "no-assets")}
    )
    try:
        created = server.client.post(WORKSPACES, json={"provider": "fake"})
        assert created.status_code == 201, created.text
        browsing = Browsing(chromium, server, "no-assets")
        page = browsing.page
        try:
            page.goto(f"{server.url}/")
            page.locator("#banner:not([hidden])").wait_for()
            assert "make bootstrap" in page.locator("#banner").inner_text()
            page.fill("#token", TOKEN)
            page.click("#login-form button[type=submit]")
            page.locator("h1", has_text="Workspaces").wait_for()
            page.goto(f"{server.url}/#/workspaces/{created.json()['id']}/terminal")
            page.locator("#terminal-missing").wait_for()
            assert "make bootstrap" in page.locator("#terminal-missing").inner_text()
            browsing.shot("terminal-without-assets")
        finally:
            browsing.context.close()
        assert browsing.outside == []
    finally:
        stop_server(server)
