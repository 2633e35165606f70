"""Benchmarks: Corral's latency, scale and memory against plain Docker, measured in the same run.

``make bench`` (``python -m bench``) prints one table with p50 and p95 for Corral and for the plain alternative, the
ratio, and the targets of the speed issue; ``make bench-quick`` does the same with smaller counts. Modules:

* :mod:`bench.latency`: session ready (warm pool vs cold), create to first command, exec and file round trips;
* :mod:`bench.tools`: the agent's tool calls against a plain exec, and through ``corral mcp`` against HTTP;
* :mod:`bench.scale`: many sessions started at once;
* :mod:`bench.memory`: memory per idle gVisor workspace and how many fit;
* :mod:`bench.plain`: the plain alternative, straight through the Docker Engine API;
* :mod:`bench.server`: a real ``corral serve`` subprocess and its client;
* :mod:`bench.context`, :mod:`bench.stats`, :mod:`bench.report`: shared state and clean-up, percentiles, the table.
"""
