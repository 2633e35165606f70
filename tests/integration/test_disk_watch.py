"""Where the disk limit cannot be enforced, usage is watched and a warning is recorded near the limit."""

from __future__ import annotations

import pytest

from corral.orchestrator.disk import DiskWatcher
from corral.orchestrator.service import CreateWorkspace, WorkspaceService
from corral.providers.base import ExecRequest, ResourceLimits

pytestmark = pytest.mark.integration


async def test_usage_near_the_disk_limit_adds_one_warning(real_service: WorkspaceService) -> None:
    """A gVisor workspace filled to 90% of a 64M disk limit gets one disk warning, and one only."""
    limits = ResourceLimits(cpu=1, memory_bytes=256 * 1024**2, disk_bytes=64 * 1024**2)
    record = await real_service.create(CreateWorkspace(provider="gvisor", limits=limits))
    watcher = DiskWatcher(real_service, interval_s=3600, warn_ratio=0.9)
    assert await watcher.check_all() == []
    fill = ExecRequest("head -c 62914560 /dev/zero > /workspace/fill.bin", timeout_s=60)
    assert (await real_service.exec(record.id, fill)).exit_code == 0
    assert await watcher.check_all() == [record.id]
    assert await watcher.check_all() == []
    warnings = (await real_service.get(record.id)).warnings
    assert len(warnings) == 1
    assert "disk usage" in warnings[0] and "64M limit" in warnings[0]
