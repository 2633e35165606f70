"""The ``fake`` provider: an in-memory test double for the layers above providers (orchestrator, API).

Nothing leaves the process: a workspace is a dict of files and a dict of directories, and ``exec`` runs a tiny
deterministic interpreter that understands just enough ``/bin/sh`` for the conformance suite and for unit tests.

============  ======================================================================================================
``fs``        the in-memory file system: files, directories and symlinks, resolved the way the kernel does
``shell``     the fake ``/bin/sh``: parser and interpreter of the few commands tests need
``provider``  :class:`FakeProvider`: lifecycle, exec and file calls on top of both, with failure injection
============  ======================================================================================================
"""

from __future__ import annotations

from corral.providers.fake.fs import CHUNK_SIZE
from corral.providers.fake.provider import FakeProvider

__all__ = ["CHUNK_SIZE", "FakeProvider"]
