"""Credentials: masking URLs and free text, splitting them for git, sealing them at rest, and private file modes."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest

from corral.agents.config import config_from_json, parse_workspace_config
from corral.api.app import private_data_dir
from corral.credentials import (
    MASK,
    RedactingFilter,
    SecretBox,
    clean_url,
    has_credentials,
    load_secret_box,
    redact_text,
    redact_url,
    split_url,
)
from corral.errors import CredentialUnavailableError, InvalidRequestError
from corral.providers.base import ResourceLimits
from corral.store import Store
from corral.tools.audit import summarize_arguments

pytestmark = pytest.mark.unit

SECRET_PARAMS = [
    "access_token", "token", "private_token", "password", "passwd", "key", "api_key", "apikey", "secret",
    "client_secret", "sig", "signature", "auth", "ACCESS_TOKEN", "Private-Token", "X-Amz-Signature", "refresh_token",
]  # fmt: skip


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# --- masking ---------------------------------------------------------------------------------------------------------


def test_userinfo_is_masked_whole() -> None:
    """The whole userinfo becomes ***, whether it holds a user and password, a bare token or an unescaped @."""
    assert (
        redact_url("https://x-access-token:S3CR3T@git.example/org/repo.git") == "https://***@git.example/org/repo.git"
    )
    assert redact_url("https://ghtoken@git.example/r.git") == "https://***@git.example/r.git"
    assert redact_url("http://u:p@ss@host:8080/r.git") == "http://***@host:8080/r.git"
    assert redact_url("http://u:p@host:notaport/r") == "http://***@host:notaport/r"


@pytest.mark.parametrize("name", SECRET_PARAMS)
def test_secret_query_parameters_are_masked_whatever_their_case(name: str) -> None:
    """Every secret parameter name, in any case, has its value masked; other parameters are kept as they are."""
    url = f"https://git.example/r.git?ref=main&{name}=S3CR3T&depth=1"
    assert redact_url(url) == f"https://git.example/r.git?ref=main&{name}={MASK}&depth=1"
    assert "S3CR3T" not in clean_url(url)
    assert clean_url(url) == "https://git.example/r.git?ref=main&depth=1"


def test_urls_without_credentials_are_unchanged() -> None:
    """A URL with nothing secret goes through every function as it is."""
    for url in ("https://git.example/org/repo.git", "http://127.0.0.1:8000/a.git?ref=main", "https://h/x#frag"):
        assert redact_url(url) == url
        assert clean_url(url) == url
        assert not has_credentials(url)


def test_split_gives_git_the_header_and_the_secret_url() -> None:
    """The userinfo becomes a Basic Authorization value and secret parameters a separate fetch URL; the clean URL
    keeps neither."""
    split = split_url("https://user:pa%40ss@git.example/r.git?access_token=T0K&ref=x")
    assert split.clean == "https://git.example/r.git?ref=x"
    assert split.authorization == "Basic dXNlcjpwYUBzcw=="  # base64("user:pa@ss"), the password unescaped
    assert split.fetch_url == "https://git.example/r.git?access_token=T0K&ref=x"
    assert split.has_credentials
    only_user = split_url("https://user:pw@git.example/r.git")
    assert (only_user.fetch_url, only_user.clean) == (None, "https://git.example/r.git")
    only_query = split_url("https://git.example/r.git?token=T0K")
    assert (only_query.authorization, only_query.clean) == (None, "https://git.example/r.git")


def test_free_text_is_masked() -> None:
    """URLs inside text, Authorization values, secret assignments and well-known token shapes are all masked."""
    git_stderr = "fatal: unable to access 'http://127.0.0.1:9/x.git?access_token=SECRET1/': Failed to connect"
    assert (
        redact_text(git_stderr)
        == "fatal: unable to access 'http://127.0.0.1:9/x.git?access_token=***': Failed to connect"
    )
    command = (
        "git -c 'http.extraHeader=Authorization: Basic eHg6eXk=' clone https://u:SECRET2@h/x.git; "
        'curl -H "Authorization: Bearer SECRET3" -H "Private-Token: SECRET4" postgresql://a:SECRET5@db/x; '
        "export GITHUB_TOKEN=SECRET6; mysql --password=SECRET7; echo ghp_" + "a" * 36
    )
    masked = redact_text(command)
    for n in range(1, 8):
        assert f"SECRET{n}" not in masked
    assert "eHg6eXk=" not in masked and "ghp_" not in masked
    assert "Authorization: Basic ***" in masked and "Authorization: Bearer ***" in masked
    assert "https://***@h/x.git" in masked and "GITHUB_TOKEN=***;" in masked
    assert redact_text(masked) == masked, "masking twice changes nothing"


def test_ordinary_text_is_left_alone() -> None:
    """Words that merely resemble secrets (max_tokens=5, 'authorization failed') are not masked."""
    text = "max_tokens=5 tokens=3 authorization failed for https://git.example/r.git (HTTP 401)"
    assert redact_text(text) == text


def test_log_filter_masks_message_arguments_and_traceback() -> None:
    """The logging filter masks a record's formatted message and its traceback, and never drops the record."""
    record = logging.LogRecord(
        "corral.x", logging.WARNING, __file__, 1, "cloning %s failed", ("https://u:S1@h/r",), None
    )
    try:
        raise RuntimeError("git said https://h/r?token=S2")
    except RuntimeError as exc:
        record.exc_info = (type(exc), exc, exc.__traceback__)
    assert RedactingFilter().filter(record) is True
    text = logging.Formatter().format(record)
    assert "S1" not in text and "S2" not in text
    assert "cloning https://***@h/r failed" in text and "token=***" in text


def test_audit_summary_masks_before_it_clips() -> None:
    """A credential cut by the 200-character clip is still masked, because masking comes first."""
    command = "echo " + "x" * 161 + " && git clone https://user:LONGSECRETVALUE@git.example/org/repo.git"
    assert command.index("LONGSECRET") < 200 < command.index("VALUE@"), "the clip falls inside the credential"
    summary = summarize_arguments("bash", {"command": command})
    assert "LONG" not in summary and "https://***@git" in summary
    git = summarize_arguments("git", {"args": ["remote", "add", "up", "https://h/r.git?access_token=TOK"]})
    assert git == "git remote add up 'https://h/r.git?access_token=***'"


# --- sealing ---------------------------------------------------------------------------------------------------------


def test_sealed_values_open_only_with_the_same_key_and_purpose() -> None:
    """A sealed value holds no plaintext, opens with its key and purpose, and fails clearly otherwise."""
    box = SecretBox.from_secret("a-long-operator-secret")
    sealed = box.seal("https://u:S3CR3T@h/r.git", purpose="repo_source URL")
    assert "S3CR3T" not in sealed and sealed.startswith("v1.")
    assert box.open(sealed, purpose="repo_source URL") == "https://u:S3CR3T@h/r.git"
    assert SecretBox.from_secret("a-long-operator-secret").open(sealed, purpose="repo_source URL").endswith("r.git")
    with pytest.raises(CredentialUnavailableError, match="cannot be decrypted"):
        SecretBox.from_secret("another-operator-secret").open(sealed, purpose="repo_source URL")
    with pytest.raises(CredentialUnavailableError):
        box.open(sealed, purpose="task repository URL")
    with pytest.raises(CredentialUnavailableError):
        box.open(sealed[:-4] + "AAAA", purpose="repo_source URL")
    with pytest.raises(ValueError, match="at least 16"):
        SecretBox.from_secret("short")


def test_generated_key_file_is_private_and_stable(tmp_path: Path) -> None:
    """Without CORRAL_SECRET_KEY a key is generated once into secret-key (0600), reused, and tightened if loose."""
    data = tmp_path / "data"
    first = load_secret_box(data, None)
    key_file = data / "secret-key"
    assert _mode(key_file) == 0o600
    sealed = first.seal("x", purpose="p")
    key_file.chmod(0o644)
    assert load_secret_box(data, None).open(sealed, purpose="p") == "x"
    assert _mode(key_file) == 0o600
    assert [p.name for p in data.iterdir()] == ["secret-key"], "no draft file is left behind"
    configured = load_secret_box(tmp_path / "other", "configured-secret-key-value")
    with pytest.raises(CredentialUnavailableError):
        configured.open(sealed, purpose="p")


# --- configs ----------------------------------------------------------------------------------------------------------


def test_config_answers_never_carry_the_sealed_credential() -> None:
    """The API form of a config masks the URL and has no sealed_url; only the stored form keeps it, and a client
    cannot send one."""
    stored = {"enabled": True, "repo_source": {"type": "fixed", "url": "https://***@h/r.git", "sealed_url": "v1.x"}}
    config = config_from_json(stored)
    assert config.repo_source.sealed_url == "v1.x"
    assert "sealed_url" not in config.to_json()["repo_source"]
    assert config.to_json(include_sealed=True)["repo_source"]["sealed_url"] == "v1.x"
    plain = parse_workspace_config(
        {"repo_source": {"type": "fixed", "url": "https://u:S3CR3T@h/r.git"}}, default_limits=ResourceLimits()
    )
    assert plain.to_json()["repo_source"]["url"] == "https://***@h/r.git"
    with pytest.raises(InvalidRequestError, match="sealed_url"):
        parse_workspace_config(stored, default_limits=ResourceLimits())
    with pytest.raises(InvalidRequestError) as bad:
        parse_workspace_config(
            {"repo_source": {"type": "fixed", "url": "ssh://git:S3CR3T@h/r.git"}}, default_limits=ResourceLimits()
        )
    assert "S3CR3T" not in bad.value.message and "ssh://***@h/r.git" in bad.value.message


# --- file modes -------------------------------------------------------------------------------------------------------


async def test_sqlite_database_and_its_wal_are_private(tmp_path: Path) -> None:
    """A new SQLite database, its -wal and -shm are 0600; an older install's 0644 files are tightened at open."""
    db = tmp_path / "new" / "corral.db"
    store = await Store.open(f"sqlite:///{db}")
    try:
        await store.agent_types.create("t", {})
        for name in ("corral.db", "corral.db-wal", "corral.db-shm"):
            assert _mode(db.parent / name) == 0o600, name
        assert _mode(db.parent) == 0o700
    finally:
        await store.close()
    for name in ("corral.db", "corral.db-wal", "corral.db-shm"):
        if (db.parent / name).exists():
            (db.parent / name).chmod(0o644)
    store = await Store.open(f"sqlite:///{db}")
    try:
        assert await store.agent_types.get_by_name("t") is not None
        for path in db.parent.iterdir():
            assert _mode(path) == 0o600, path.name
    finally:
        await store.close()


def test_data_dir_is_made_private_unless_shared(tmp_path: Path) -> None:
    """The data directory is created 0700, an existing 0755 one is tightened, and a shared sticky one is left."""
    fresh = tmp_path / "fresh"
    private_data_dir(fresh)
    assert _mode(fresh) == 0o700
    old = tmp_path / "old"
    old.mkdir()
    old.chmod(0o755)
    private_data_dir(old)
    assert _mode(old) == 0o700
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    private_data_dir(shared)
    assert _mode(shared) == 0o1777
