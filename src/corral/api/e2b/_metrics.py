"""E2B's metrics routes: ``Sandbox.get_metrics`` and the latest sample of many sandboxes.

* ``GET /sandboxes/{id}/metrics?start=&end=`` answers the sandbox's samples (``SandboxMetric``: CPU count and use,
  memory used, total and cached, disk used and total), oldest first. ``start`` and ``end`` are Unix seconds and
  bound the samples inclusively at whole seconds, as E2B's store keeps them; without them every kept sample comes
  back. ``start`` after ``end`` is a 400, as on E2B.
* ``GET /sandboxes/metrics?sandbox_ids=a,b`` answers ``{"sandboxes": {id: SandboxMetric}}``, each sandbox's newest
  sample (at most 100 ids, as on E2B); a sandbox without one is left out.

Samples come from :class:`~corral.orchestrator.metrics.MetricsSampler`: every ``CORRAL_METRICS_INTERVAL_S`` (5 s)
while a sandbox runs, and at once when a request finds none that recent, so a sandbox's first call already answers
one. The last ``CORRAL_METRICS_SAMPLES`` (720: an hour) are kept per sandbox, in memory: they do not survive a
restart, and a killed sandbox's go with it. E2B samples every 5 s as well (and thins out long ranges). A paused
sandbox answers the samples taken before its pause. On providers that cannot read a sandbox's CPU and memory (fake,
firecracker, http) the list is empty, as E2B answers when its metrics are off.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any, Final

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import JSONResponse

from corral.api.e2b._errors import E2BApiError
from corral.api.e2b._state import METADATA_KEY
from corral.api.e2b.control import _ControlRoute, _invalid_param, _record, _visible, get_state
from corral.orchestrator.metrics import MetricSample, MetricsSampler

__all__ = ["metric_json", "metrics_router"]

MAX_SANDBOXES: Final = 100
"""The most sandboxes one ``GET /sandboxes/metrics`` may name (E2B's ``maxSandboxMetricsCount``)."""


def metric_json(sample: MetricSample) -> dict[str, Any]:
    """``SandboxMetric``, as E2B's API answers it."""
    moment = datetime.fromtimestamp(sample.timestamp, UTC)
    return {
        "timestamp": moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "timestampUnix": int(sample.timestamp),
        "cpuCount": sample.cpu_count,
        "cpuUsedPct": sample.cpu_used_pct,
        "memUsed": sample.mem_used,
        "memTotal": sample.mem_total,
        "memCache": sample.mem_cache,
        "diskUsed": sample.disk_used,
        "diskTotal": sample.disk_total,
    }


def get_sampler(request: Request) -> MetricsSampler:
    """The app's sampler, created by the router's lifespan."""
    sampler: MetricsSampler = request.app.state.e2b_metrics
    return sampler


def _seconds(request: Request, name: str) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise _invalid_param(name, f"value {raw} is not an integer (Unix seconds)") from None
    if value < 0:
        raise _invalid_param(name, "number must be at least 0")
    return value


async def sandbox_metrics(sandbox_id: str, request: Request) -> JSONResponse:
    """A sandbox's samples between ``start`` and ``end``, oldest first."""
    state, sampler = get_state(request), get_sampler(request)
    record, _ = await _visible(state, sandbox_id)
    start, end = _seconds(request, "start"), _seconds(request, "end")
    if start is not None and end is not None and start > end:
        raise E2BApiError(400, "Invalid time range for metrics: start time cannot be after end time")
    await sampler.fresh(record)
    # Whole seconds, as E2B stores them: a sample at 12.7 s is within end=12.
    samples = sampler.samples(record.id, start, None if end is None else end + 0.999999)
    return JSONResponse([metric_json(s) for s in samples])


async def sandboxes_metrics(request: Request) -> JSONResponse:
    """The newest sample of each named sandbox that has one."""
    state, sampler = get_state(request), get_sampler(request)
    raw = request.query_params.get("sandbox_ids")
    if raw is None:
        raise _invalid_param("sandbox_ids", "value is required but missing")
    ids = list(dict.fromkeys(part.strip() for part in raw.split(",") if part.strip()))
    if len(ids) > MAX_SANDBOXES:
        raise E2BApiError(400, f"Too many sandboxes requested, maximum is {MAX_SANDBOXES}")
    answer: dict[str, Any] = {}
    for sandbox_id in ids:
        found = await _record(state, sandbox_id)
        if found is None:
            continue
        sample = await sampler.fresh(found[0])
        if sample is not None:
            answer[sandbox_id] = metric_json(sample)
    return JSONResponse({"sandboxes": answer})


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    # Runs inside create_app's lifespan (FastAPI nests included routers' lifespans), so the service exists.
    service = app.state.service
    sampler = MetricsSampler(
        service,
        interval_s=service.settings.metrics_interval_s,
        capacity=service.settings.metrics_samples,
        watch=lambda record: METADATA_KEY in record.metadata,  # E2B sandboxes only: nothing else asks
    )
    app.state.e2b_metrics = sampler
    sampler.start()
    try:
        yield
    finally:
        await sampler.stop()


def metrics_router() -> APIRouter:
    """The metrics routes, authenticated as the control plane (include it under ``/e2b`` before
    :func:`~corral.api.e2b.control.control_router`: ``/sandboxes/metrics`` would otherwise match
    ``/sandboxes/{sandbox_id}``)."""
    router = APIRouter(route_class=_ControlRoute, tags=["e2b"], lifespan=_lifespan)
    routes: list[tuple[str, Callable[..., Awaitable[Response]]]] = [
        ("/sandboxes/metrics", sandboxes_metrics),
        ("/sandboxes/{sandbox_id}/metrics", sandbox_metrics),
    ]
    for path, endpoint in routes:
        router.add_api_route(path, endpoint, methods=["GET"], name=f"e2b_{endpoint.__name__}")
    return router
