"""The web console's routes: public pages with a strict CSP, files served by allow-list only, and a clear answer
when ``make bootstrap`` has not installed the browser assets. The browser side is tested in tests/e2e."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from corral.api.app import create_app
from corral.console import VENDOR_FILES
from corral.console.routes import STATIC_DIR
from corral.providers.fake import FakeProvider
from corral.settings import Settings

pytestmark = pytest.mark.unit


@asynccontextmanager
async def serve(tmp_path: Path, assets: Path) -> AsyncIterator[httpx.AsyncClient]:
    """The app over a fake provider with ``assets`` as CORRAL_WEB_ASSETS_DIR, and a client WITHOUT a token."""
    config = Settings(
        data_dir=tmp_path / "data",
        api_token="unit-test-token",
        providers="fake",
        warm_pool_size=0,
        e2b_warm_pool_size=0,
        web_assets_dir=assets,
    )
    app = create_app(config, providers={"fake": FakeProvider("fake")})
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://corral") as http,
    ):
        yield http


@pytest.fixture
def assets(tmp_path: Path) -> Path:
    """A node_modules with each allow-listed file (and a secret beside them that must never be served)."""
    root = tmp_path / "node_modules"
    for name, relative in VENDOR_FILES.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(f"/* {name} */\n")
    (root / "@xterm/xterm/package.json").write_text("{}")
    (tmp_path / "secret.txt").write_text("not for the browser")
    return root


async def test_the_page_is_public_and_carries_a_strict_content_security_policy(tmp_path: Path, assets: Path) -> None:
    """``/`` answers the console's HTML without a token, with a CSP allowing this origin only and no inline code."""
    async with serve(tmp_path, assets) as http:
        page = await http.get("/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert '<script type="module" src="/console/static/main.js">' in page.text
    policy = page.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "script-src 'self';" in policy and "style-src 'self'" in policy
    assert "connect-src 'self'" in policy and "frame-ancestors 'none'" in policy
    # Only styles may be inline (xterm.js writes its theme into <style>); never scripts, never another origin.
    assert policy.count("unsafe") == 1 and "style-src 'self' 'unsafe-inline'" in policy and "http" not in policy
    assert page.headers["x-content-type-options"] == "nosniff"


async def test_own_files_are_served_by_exact_name_only(tmp_path: Path, assets: Path) -> None:
    """A console file is served with its type; an unknown name or a path trying to leave the directory is a 404."""
    async with serve(tmp_path, assets) as http:
        script = await http.get("/console/static/main.js")
        style = await http.get("/console/static/console.css")
        unknown = await http.get("/console/static/nope.js")
        escapes = [
            await http.get(path)
            for path in (
                "/console/static/..%2Froutes.py",
                "/console/static/%2E%2E%2F__init__.py",
                "/console/static/..%2F..%2Fsettings.py",
            )
        ]
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
    assert "content-security-policy" in script.headers
    assert style.status_code == 200 and style.headers["content-type"].startswith("text/css")
    assert unknown.status_code == 404
    assert [r.status_code for r in escapes] == [404, 404, 404]
    assert all("import" not in r.text for r in escapes)


async def test_vendor_files_come_from_the_assets_directory_by_allow_list(tmp_path: Path, assets: Path) -> None:
    """Each allow-listed npm file is served from CORRAL_WEB_ASSETS_DIR; other files there, or beside it, are not."""
    async with serve(tmp_path, assets) as http:
        served = {name: await http.get(f"/console/vendor/{name}") for name in VENDOR_FILES}
        others = [
            await http.get(path)
            for path in (
                "/console/vendor/package.json",
                "/console/vendor/..%2Fsecret.txt",
                "/console/vendor/%40xterm%2Fxterm%2Fpackage.json",
            )
        ]
        status = (await http.get("/console/assets")).json()
    assert {name: (r.status_code, r.text) for name, r in served.items()} == {
        name: (200, f"/* {name} */\n") for name in VENDOR_FILES
    }
    assert served["xterm.css"].headers["content-type"].startswith("text/css")
    assert served["xterm.mjs"].headers["content-type"].startswith("text/javascript")
    assert [r.status_code for r in others] == [404, 404, 404]
    assert not any("not for the browser" in r.text or r.text == "{}" for r in others)
    assert status == {"missing": [], "hint": None}


async def test_missing_assets_answer_with_the_command_that_installs_them(tmp_path: Path) -> None:
    """Without ``make bootstrap``'s node_modules, a vendor file is a 404 saying to run it, and /console/assets
    names what is missing, so the page can say so instead of going blank."""
    async with serve(tmp_path, tmp_path / "absent") as http:
        missing = await http.get("/console/vendor/xterm.mjs")
        status = (await http.get("/console/assets")).json()
        page = await http.get("/")
    assert missing.status_code == 404
    assert "make bootstrap" in missing.text and "CORRAL_WEB_ASSETS_DIR" in missing.text
    assert str(tmp_path) not in missing.text  # the server's layout is nobody's business
    assert status["missing"] == sorted(VENDOR_FILES) and "make bootstrap" in status["hint"]
    assert page.status_code == 200


def test_console_sources_load_nothing_from_elsewhere_and_never_parse_strings_as_html() -> None:
    """The console's own files name no outside URL (no CDN), use no inline script or style, and never assign HTML
    from a string (API data is attacker-written: it only ever becomes text)."""
    sources = {p.name: p.read_text() for p in STATIC_DIR.iterdir() if p.suffix in (".html", ".js", ".css")}
    assert {"index.html", "main.js", "terminal.js", "files.js", "console.css"} <= set(sources)
    for name, text in sources.items():
        assert not re.search(r"https?://", text.replace("http://www.w3.org/2000/svg", "")), name
        assert not re.search(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|eval\(|new Function", text), name
    html = sources["index.html"]
    assert not re.search(r"<script(?![^>]*\bsrc=)", html) and "<style" not in html and " style=" not in html
    assert not re.search(r"\son[a-z]+=", html)
