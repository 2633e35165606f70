"""Credentials in repository URLs and free text: masking them, splitting them off, and sealing the few we keep.

A repository URL may carry a secret in two places: the userinfo (``https://user:TOKEN@host/...``) and the query
(``?access_token=TOKEN``, ``?private_token=...``, a signed URL's ``sig``...). Everything the outside world can see
(API answers, database rows, workspace metadata, error messages, logs, the audit log) shows such URLs masked:

* :func:`redact_url` replaces the whole userinfo and the value of every secret query (or fragment) parameter with
  ``***``: ``https://***@git.example/org/repo.git?access_token=***``. A masked URL stays recognisable (the operator
  sees that a credential is set) and is stable, so a client can send it back to mean "keep the stored credential".
* :func:`redact_text` finds URLs (any ``scheme://``), ``Authorization:`` header values, ``NAME=value`` assignments
  whose name says secret (``GITHUB_TOKEN=...``, ``password=...``) and well-known token shapes (``ghp_...``) inside
  free text such as git's stderr, error messages and bash commands, and masks them.
* :func:`split_url` gives the host-side clone what it needs: the clean URL (no userinfo, no secret parameters; it
  becomes the checkout's ``origin``), the ``Authorization`` header value made from the userinfo, and the URL git
  must really fetch when secret parameters belong to it. Git gets the secrets through ``GIT_CONFIG_*`` environment
  variables, never in its argument list.
* :class:`RedactingFilter` is a :class:`logging.Filter` that masks every record's message, arguments and traceback;
  ``corral serve`` puts it on its log handlers, behind the redaction already done where messages are made.

Where a credential must outlive the request (the fixed ``repo_source`` URL of an agent type, and a task's URL that
provisioning needs again after a restart) it is sealed with AES-256-GCM by a :class:`SecretBox`. Its key comes from
``CORRAL_SECRET_KEY`` or, when that is unset, from ``$CORRAL_DATA_DIR/secret-key``, generated once with mode 0600
(:func:`load_secret_box`). Servers sharing one database must share the key; a lost key makes the sealed credentials
unreadable (:class:`~corral.errors.CredentialUnavailableError`), never readable in clear.
"""

from __future__ import annotations

import base64
import logging
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import unquote

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from corral.errors import CredentialUnavailableError

__all__ = [
    "MASK",
    "SECRET_KEY_FILE",
    "RedactingFilter",
    "SecretBox",
    "SplitURL",
    "clean_url",
    "has_credentials",
    "is_secret_name",
    "load_secret_box",
    "redact_text",
    "redact_url",
    "split_url",
]

MASK: Final = "***"
"""What a credential is replaced with."""

SECRET_KEY_FILE: Final = "secret-key"  # noqa: S105 - a file name, not a secret
"""The file in the data directory holding the generated key when ``CORRAL_SECRET_KEY`` is unset."""

_SECRET_NAMES = frozenset(
    {
        "access_token", "token", "private_token", "auth_token", "id_token", "refresh_token", "session_token",
        "oauth_token", "password", "passwd", "pwd", "pass", "key", "api_key", "apikey", "access_key", "secret",
        "client_secret", "secret_key", "sig", "signature", "auth", "authorization", "credential", "credentials",
        "x_amz_signature", "x_amz_credential", "x_amz_security_token", "x_goog_signature", "x_goog_credential",
    }
)  # fmt: skip
_SECRET_SUFFIXES = ("token", "secret", "password", "passwd", "api_key", "apikey", "access_key", "private_key")

_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>`]+")
_AUTH_HEADER = re.compile(
    r"(?i)\b((?:proxy-)?authorization|private-token|x-api-key|x-auth-token|api-key)(\s*[:=]\s*)"
    r"(?:(basic|bearer|token|digest|negotiate)\s+)?([^\s'\"`,;]+)"
)
_ASSIGNMENT = re.compile(
    r"(?i)\b([A-Za-z0-9_.\-]*?(?:token|secret|password|passwd|api_?key|access_?key))=([^\s&;|<>()'\"`]+)"
)
_TOKEN_SHAPES = re.compile(  # GitHub, GitLab and Slack tokens, whose shape alone gives them away
    r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}|glpat-[A-Za-z0-9_\-]{20,}"
    r"|xox[abposr]-[A-Za-z0-9-]{10,})"
)
_SEALED_VERSION = "v1"


def is_secret_name(name: str) -> bool:
    """Whether a query parameter (or variable) of this name holds a secret: ``access_token``, ``sig``, ... any case."""
    normalized = unquote(name).strip().lower().replace("-", "_")
    return normalized in _SECRET_NAMES or normalized.endswith(_SECRET_SUFFIXES)


@dataclass(frozen=True, slots=True)
class _Parts:
    """A URL cut where credentials live, by hand: ``urlsplit`` rejects some malformed ports we must still mask."""

    scheme: str  # "https://"
    userinfo: str | None
    host: str
    path: str
    query: str | None
    fragment: str | None


def _parse(url: str) -> _Parts | None:
    scheme, sep, rest = url.partition("://")
    if not sep or not scheme:
        return None
    end = len(rest)
    for stop in "/?#":
        index = rest.find(stop)
        if index != -1:
            end = min(end, index)
    authority, tail = rest[:end], rest[end:]
    userinfo, at, host = authority.rpartition("@")
    tail, hash_, fragment = tail.partition("#")
    path, question, query = tail.partition("?")
    return _Parts(
        scheme=scheme + sep,
        userinfo=userinfo if at else None,
        host=host,
        path=path,
        query=query if question else None,
        fragment=fragment if hash_ else None,
    )


def _params(text: str | None, *, mask: bool) -> tuple[str | None, list[str]]:
    """``(text with secret parameters masked or dropped, the dropped ones)``; None stays None."""
    if text is None:
        return None, []
    kept, secret = [], []
    for item in re.split(r"([&;])", text):
        name, eq, _ = item.partition("=")
        if item not in ("&", ";") and eq and is_secret_name(name):
            secret.append(item)
            if mask:
                kept.append(f"{name}={MASK}")
            continue
        kept.append(item)
    if not mask:  # drop the separators left dangling by removed parameters
        words = [w for w in kept if w not in ("&", ";")]
        return "&".join(words), secret
    return "".join(kept), secret


def _join(parts: _Parts, userinfo: str | None, query: str | None, fragment: str | None) -> str:
    url = parts.scheme + (f"{userinfo}@" if userinfo is not None else "") + parts.host + parts.path
    if query is not None:
        url += "?" + query
    if fragment is not None:
        url += "#" + fragment
    return url


def redact_url(url: str) -> str:
    """The URL with its userinfo and every secret parameter value replaced by ``***``.

    ``https://u:p@h/r.git?access_token=t&x=1`` becomes ``https://***@h/r.git?access_token=***&x=1``. Text that is
    not a ``scheme://`` URL is handed to :func:`redact_text`.
    """
    parts = _parse(url)
    if parts is None:
        return redact_text(url)
    query, _ = _params(parts.query, mask=True)
    fragment, _ = _params(parts.fragment, mask=True)
    return _join(parts, MASK if parts.userinfo is not None else None, query, fragment)


def clean_url(url: str) -> str:
    """The URL without userinfo and without secret parameters: what ``origin`` and workspace metadata show."""
    return split_url(url).clean


@dataclass(frozen=True, slots=True)
class SplitURL:
    """A repository URL taken apart for the host-side clone."""

    clean: str
    """No userinfo, no secret parameters: safe to show, to pass in argv, and to keep as ``origin``."""
    authorization: str | None
    """``Basic base64(user:password)`` from the userinfo, for an ``Authorization`` header; None without userinfo."""
    fetch_url: str | None
    """The URL git must fetch when secret parameters are part of it (userinfo removed), else None."""

    @property
    def has_credentials(self) -> bool:
        """Whether the URL carried anything secret."""
        return self.authorization is not None or self.fetch_url is not None


def split_url(url: str) -> SplitURL:
    """Split ``url`` into its clean form, the ``Authorization`` value of its userinfo, and the secret fetch URL."""
    parts = _parse(url)
    if parts is None:
        return SplitURL(url, None, None)
    authorization = None
    if parts.userinfo is not None:
        user, _, password = parts.userinfo.partition(":")
        token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode()
        authorization = f"Basic {token}"
    query, query_secrets = _params(parts.query, mask=False)
    fragment, fragment_secrets = _params(parts.fragment, mask=False)
    clean = _join(
        parts,
        None,
        query if query or not query_secrets else None,
        fragment if fragment or not fragment_secrets else None,
    )
    fetch_url = None
    if query_secrets or fragment_secrets:
        fetch_url = _join(parts, None, parts.query, parts.fragment)
    return SplitURL(clean, authorization, fetch_url)


def has_credentials(url: str) -> bool:
    """Whether the URL carries userinfo or a secret parameter."""
    return split_url(url).has_credentials


def _mask_header(match: re.Match[str]) -> str:
    scheme = f"{match.group(3)} " if match.group(3) else ""
    return f"{match.group(1)}{match.group(2)}{scheme}{MASK}"


def redact_text(text: str) -> str:
    """``text`` with every credential it contains masked: URLs, ``Authorization`` values, secret assignments.

    Meant for free text (git's stderr, error messages, shell commands, log lines). Masking is idempotent.
    """
    if not text:
        return text
    text = _URL.sub(lambda m: redact_url(m.group(0)), text)
    text = _AUTH_HEADER.sub(_mask_header, text)
    text = _ASSIGNMENT.sub(lambda m: f"{m.group(1)}={MASK}", text)
    return _TOKEN_SHAPES.sub(MASK, text)


class RedactingFilter(logging.Filter):
    """Masks credentials in every record a handler emits: its message with arguments, and its traceback.

    Put it on handlers, not loggers: a handler's filters see the records of every logger that propagates to it.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite the record in place where it holds a credential; never drops one."""
        try:
            message = record.getMessage()
        except Exception:  # a broken format string: leave it to the handler's own error reporting
            return True
        if redact_text(message) != message:
            if isinstance(record.args, tuple) and record.name.startswith("uvicorn.access"):
                # uvicorn's access formatter unpacks the arguments, so they are masked one by one.
                record.args = tuple(redact_text(a) if isinstance(a, str) else a for a in record.args)
            else:
                record.msg, record.args = redact_text(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text)
        if record.stack_info:
            record.stack_info = redact_text(record.stack_info)
        return True


# --- sealing ----------------------------------------------------------------------------------------------------------


class SecretBox:
    """Seals and opens short secrets with AES-256-GCM; each sealed value says what it is for (its ``purpose``)."""

    def __init__(self, key: bytes) -> None:
        if len(key) != 32:
            raise ValueError("a SecretBox key is 32 bytes (AES-256)")
        self._aead = AESGCM(key)

    @classmethod
    def from_secret(cls, secret: str) -> SecretBox:
        """The box for an operator's secret string (any length ≥ 16); the AES key is derived with HKDF-SHA256."""
        if len(secret.strip()) < 16:
            raise ValueError("CORRAL_SECRET_KEY must be at least 16 characters (e.g. `openssl rand -base64 32`)")
        key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"corral credential sealing v1").derive(
            secret.strip().encode()
        )
        return cls(key)

    @classmethod
    def ephemeral(cls) -> SecretBox:
        """A box with a random key that lives as long as the process (tests, and services built without a key)."""
        return cls(AESGCM.generate_key(bit_length=256))

    def seal(self, plaintext: str, *, purpose: str) -> str:
        """``v1.<base64url(nonce + ciphertext)>``; ``purpose`` is authenticated, so a value only opens for it."""
        nonce = os.urandom(12)
        sealed = self._aead.encrypt(nonce, plaintext.encode(), purpose.encode())
        return f"{_SEALED_VERSION}.{base64.urlsafe_b64encode(nonce + sealed).decode()}"

    def open(self, sealed: str, *, purpose: str) -> str:
        """The plaintext of a value made by :meth:`seal` with the same key and purpose.

        Raises:
            CredentialUnavailableError: another key, another purpose, a damaged value.
        """
        version, _, payload = sealed.partition(".")
        unavailable = CredentialUnavailableError(
            f"the stored {purpose} cannot be decrypted (the secret key changed, or the value is damaged); "
            "give the credential again",
            details={"purpose": purpose},
        )
        if version != _SEALED_VERSION:
            raise unavailable
        try:
            raw = base64.urlsafe_b64decode(payload.encode())
            return self._aead.decrypt(raw[:12], raw[12:], purpose.encode()).decode()
        except (InvalidTag, ValueError) as exc:
            raise unavailable from exc


def load_secret_box(data_dir: Path, configured: str | None) -> SecretBox:
    """The box for ``CORRAL_SECRET_KEY``, or for the key in ``data_dir/secret-key``, generated once (mode 0600)."""
    if configured:
        return SecretBox.from_secret(configured)
    path = data_dir / SECRET_KEY_FILE
    data_dir.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        # Written whole under a private name, then linked into place: a second server starting at the same moment
        # either wins the link or reads the complete key of the one that did, never a half-written file.
        draft = data_dir / f".{SECRET_KEY_FILE}.{secrets.token_hex(8)}"
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as file:
            file.write(secrets.token_urlsafe(32) + "\n")
        try:
            os.link(draft, path)
            logging.getLogger(__name__).warning(
                "CORRAL_SECRET_KEY is not set; generated one and wrote it to %s (keep it: sealed credentials "
                "cannot be read without it)",
                path,
            )
        except FileExistsError:
            pass
        finally:
            draft.unlink()
    if path.stat().st_mode & 0o077:
        path.chmod(0o600)  # an install from before this check, or a copy made without care
    return SecretBox.from_secret(path.read_text())
