"""E2B snapshots are Corral snapshots: how their ids and names map.

E2B treats a snapshot as a template. ``create_snapshot`` answers ``{"snapshotID": ..., "names": [...]}``,
``Sandbox.create(snapshot_id)`` sends the id as ``templateID``, ``list_snapshots`` filters by "name or ID", and
``delete_snapshot`` deletes it as ``DELETE /templates/{id}``. Here:

* ``snapshotID`` is the Corral snapshot id with E2B's default tag, ``<id>:default``, and ``names`` holds
  ``<name>:default`` for a named snapshot. Either, with or without the tag, names the snapshot again, and the id
  is the one Corral's own API and CLI show.
* Several snapshots may share a name: each ``create_snapshot`` with a name already taken adds one, as E2B adds a
  build to the template. Creating from a name restores the newest ready one; deleting a name deletes them all.
* Only ready snapshots are listed; one still being taken, or failed, shows in Corral's own API with its error.
* A ``memory: false`` (``mode="filesystem"``) snapshot is taken whole and marked. A sandbox created from it is
  restarted from its disk right after the restore, so it starts without the source's processes, as on E2B.
"""

from __future__ import annotations

from typing import Any, Final

from corral.errors import SnapshotNotFoundError
from corral.orchestrator.snapshots import SnapshotService
from corral.store import SnapshotRecord

__all__ = ["FILESYSTEM_ONLY", "filesystem_only", "lookup", "snapshot_json"]

TAG: Final = "default"
_MODE_KEY: Final = "e2b_mode"
FILESYSTEM_ONLY: Final[dict[str, str]] = {_MODE_KEY: "filesystem"}
"""The metadata of a snapshot E2B asked to take without memory."""


def snapshot_json(record: SnapshotRecord) -> dict[str, Any]:
    """``SnapshotInfo``: the answer to create and the items of the list."""
    return {"snapshotID": f"{record.id}:{TAG}", "names": [f"{record.name}:{TAG}"] if record.name else []}


def filesystem_only(record: SnapshotRecord) -> bool:
    """Whether sandboxes made from this snapshot cold-boot from its disk instead of getting its processes."""
    return record.metadata.get(_MODE_KEY) == "filesystem"


async def lookup(snapshots: SnapshotService, ref: str) -> list[SnapshotRecord]:
    """The snapshots ``ref`` names, newest first: the one with that id, else every one with that name (either may
    carry the ``:default`` tag). Any status."""
    key = ref.removesuffix(f":{TAG}")
    if not key:
        return []
    try:
        return [await snapshots.get(key)]
    except SnapshotNotFoundError:
        return await snapshots.find(name=key)
