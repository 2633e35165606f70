"""File metadata (``files.write(..., metadata=...)``) for sandboxes whose file systems have no extended attributes.

envd 0.6.2 and later stores the ``X-Metadata-<key>`` headers of an upload as ``user.e2b.<key>`` xattrs of the file
and reports them in ``EntryInfo.metadata``. gVisor's file systems refuse user xattrs (``EOPNOTSUPP``, errno 95), so
Corral keeps each file's metadata in a small JSON file of its own, inside the sandbox, in a tree that mirrors the
paths of the files it describes::

    /home/user/notes/a.txt  ->  /var/lib/corral/e2b-metadata/d_home/d_user/d_notes/f_a.txt

(``d_`` and ``f_`` keep a directory and a file of the same name apart; a name too long for its prefix is hashed.)
Every access goes through the provider's ordinary file calls, so this works on every provider and needs nothing
from the guest agent.

As on E2B:

* an upload replaces the file's whole set: keys it does not send are cleared, and an upload without metadata clears
  it (envd rewrites the xattrs on every upload);
* Stat, ListDir and Move report it, and a symlink reports its target's (xattrs are read through symlinks);
* envd's Move carries it with the file, or with everything under a moved directory, and replaces what a file moved
  over had; Remove drops it.

Unlike xattrs, it belongs to the path rather than to the inode. A command in the sandbox that renames or deletes a
file (``mv``, ``rm``) leaves the metadata at the old path: the moved file has none, and a file a command later
creates at the old path shows the old metadata until the next upload there. ``setfattr`` inside the sandbox does not
change what Corral reports. The tree lives in the sandbox's root file system, not in ``/workspace``, so it is kept
and lost with that file system.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from collections.abc import Awaitable, Iterable, Mapping
from dataclasses import dataclass

from corral.errors import FileOperationError, InvalidRequestError, WorkspaceFileNotFoundError
from corral.providers.base import WorkspaceCalls

__all__ = ["METADATA_ROOT", "MetadataStore", "metadata_from_headers", "validate_metadata"]

METADATA_ROOT = "/var/lib/corral/e2b-metadata"
"""Where the mirror tree lives inside each sandbox."""
HEADER_PREFIX = "x-metadata-"
XATTR_PREFIX = "user.e2b."
"""The xattr namespace envd uses; its length counts toward envd's size limits, which Corral keeps."""
MAX_KEY_BYTES = 255 - len(XATTR_PREFIX)
"""envd's limit: the whole xattr name (prefix and key) must fit the kernel's 255 bytes."""
MAX_TOTAL_BYTES = 4096
"""envd's limit on one file's metadata: the sum of every ``user.e2b.<key>`` name and value (one ext4 block)."""
_MAX_RECORD_BYTES = 64 * 1024  # a record larger than any valid one was not written by us: ignored
_NAME_MAX = 255
_PRINTABLE = re.compile(r"[\x20-\x7e]*")


def metadata_from_headers(headers: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """The metadata of an upload, from its raw headers: ``X-Metadata-<key>: <value>``, keys lowercased as envd does.

    The first value of a repeated header wins, and a header with an empty key is ignored (both as envd).

    Raises:
        InvalidRequestError: a key or value envd would refuse (see :func:`validate_metadata`).
    """
    metadata: dict[str, str] = {}
    for raw_name, raw_value in headers:
        name = raw_name.decode("latin-1").lower()
        key = name.removeprefix(HEADER_PREFIX)
        if key != name and key and key not in metadata:
            metadata[key] = raw_value.decode("latin-1")
    validate_metadata(metadata)
    return metadata


def validate_metadata(metadata: Mapping[str, str]) -> None:
    """Refuse what envd refuses: empty or overlong keys, keys or values outside printable ASCII, too much in all.

    Raises:
        InvalidRequestError: naming the key and the rule it breaks.
    """
    total = 0
    for key, value in metadata.items():
        if not key:
            raise InvalidRequestError("invalid metadata: metadata key must not be empty")
        if len(key.encode()) > MAX_KEY_BYTES:
            raise InvalidRequestError(f"invalid metadata: metadata key {key!r} exceeds {MAX_KEY_BYTES} bytes")
        for label, text in (("key", key), (f"value for key {key!r}", value)):
            if not _PRINTABLE.fullmatch(text):
                raise InvalidRequestError(
                    f"invalid metadata: metadata {label} contains a character outside printable ASCII (0x20-0x7e)"
                )
        total += len(XATTR_PREFIX) + len(key) + len(value)
    if total > MAX_TOTAL_BYTES:
        raise InvalidRequestError(f"invalid metadata: total metadata size {total} exceeds {MAX_TOTAL_BYTES} bytes")


def _component(kind: str, name: str) -> str:
    entry = kind + name
    if len(entry.encode()) > _NAME_MAX:
        return f"{kind}~{hashlib.sha256(name.encode()).hexdigest()}"
    return entry


def mirror_dir(path: str) -> str:
    """The directory of the mirror tree that stands for the directory ``path`` (absolute, normalised)."""
    parts = [p for p in path.split("/") if p]
    return posixpath.join(METADATA_ROOT, *(_component("d_", p) for p in parts))


def mirror_file(path: str) -> str:
    """The record of the file ``path`` (absolute, normalised, not ``/``)."""
    parent, name = posixpath.split(path)
    return posixpath.join(mirror_dir(parent), _component("f_", name))


def _parse(data: bytes) -> dict[str, str]:
    try:
        record = json.loads(data)
    except ValueError:
        return {}
    if not isinstance(record, dict):
        return {}
    return {k: v for k, v in record.items() if isinstance(k, str) and isinstance(v, str)}


async def _missing_ok(call: Awaitable[object]) -> bool:
    """Await a file call whose path may well not exist; False when it did not."""
    try:
        await call
    except WorkspaceFileNotFoundError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class MetadataStore:
    """The metadata of one sandbox's files, kept in its mirror tree through ``provider``'s file calls.

    Reads never fail because of the tree (a record that is missing or unreadable is no metadata); a sandbox that is
    gone still raises as every call on it does.
    """

    provider: WorkspaceCalls
    sandbox_id: str

    async def read(self, path: str) -> dict[str, str]:
        """The metadata of the file at ``path`` ({} when it has none)."""
        try:
            stream = await self.provider.read_file(self.sandbox_id, mirror_file(path))
        except (FileOperationError, InvalidRequestError):
            return {}
        data = bytearray()
        try:
            async for chunk in stream:
                data += chunk
                if len(data) > _MAX_RECORD_BYTES:
                    return {}
        except (FileOperationError, InvalidRequestError):
            return {}
        finally:
            await stream.aclose()
        return _parse(bytes(data))

    async def names(self, directory: str) -> frozenset[str]:
        """The record names in the mirror of ``directory``: which of its files may have metadata (see :meth:`name`)."""
        try:
            entries = await self.provider.list_dir(self.sandbox_id, mirror_dir(directory))
        except (FileOperationError, InvalidRequestError):
            return frozenset()
        return frozenset(e.name for e in entries if e.type == "file")

    @staticmethod
    def name(file_name: str) -> str:
        """The record name of a file named ``file_name``, as :meth:`names` lists it."""
        return _component("f_", file_name)

    async def write(self, path: str, metadata: Mapping[str, str]) -> None:
        """Replace the metadata of the file at ``path``; an empty mapping clears it.

        Raises:
            FileOperationError: the record could not be written (the message says why).
        """
        record = mirror_file(path)
        if not metadata:
            await _missing_ok(self.provider.delete(self.sandbox_id, record))
            return
        data = json.dumps(dict(metadata), separators=(",", ":"), sort_keys=True).encode()
        try:
            await self.provider.write_file(self.sandbox_id, record, data, mode=0o600)
        except (FileOperationError, InvalidRequestError) as exc:
            raise FileOperationError(f"error writing file metadata for {path}: {exc.message}") from exc

    async def moved(self, source: str, destination: str, *, directory: bool) -> None:
        """Follow envd's Move of ``source`` to ``destination``: the metadata goes along and replaces what was there."""
        if directory:  # rename(2) moves a directory only onto an empty one: whatever its mirror holds is stale
            await _missing_ok(self.provider.delete(self.sandbox_id, mirror_dir(destination), recursive=True))
            await _missing_ok(self.provider.move(self.sandbox_id, mirror_dir(source), mirror_dir(destination)))
            return
        moved = await _missing_ok(self.provider.move(self.sandbox_id, mirror_file(source), mirror_file(destination)))
        if not moved:  # the moved file had none, so the destination has none now
            await _missing_ok(self.provider.delete(self.sandbox_id, mirror_file(destination)))

    async def removed(self, path: str) -> None:
        """Follow envd's Remove of ``path``: drop the metadata of the file, or of everything under the directory."""
        await _missing_ok(self.provider.delete(self.sandbox_id, mirror_file(path)))
        await _missing_ok(self.provider.delete(self.sandbox_id, mirror_dir(path), recursive=True))
