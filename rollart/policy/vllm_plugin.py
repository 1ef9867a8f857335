"""Loaded by vLLM in each of its processes (engine core, workers) through the
`vllm.general_plugins` entry point: how they wait for each other.

vLLM's processes hand steps over through shared memory and busy-loop for a second after every
message, so an engine that serves a request every few milliseconds never sleeps: on a CPU host
two such loops hold both cores, and the process that should compute waits for one of them. The
notification that is meant to wake a sleeping reader is not reliable enough to sleep on alone
(measured: 1.9 s per request, readers waking only at vLLM's 5 s recheck). So with
`engine.poll_ms` (passed in the environment by rollart.policy.engine) a reader sleeps in
`poll_ms` slices, checking the shared memory after each. Engines rollart did not start are left
alone.
"""

from __future__ import annotations

import os

POLL_ENV = "ROLLART_VLLM_POLL_MS"


def sleep_between_polls() -> None:
    poll_ms = os.environ.get(POLL_ENV)
    if poll_ms is None:
        return
    from vllm.distributed.device_communicators import shm_broadcast

    original = shm_broadcast.SpinCondition.__init__
    if getattr(original, "rollart_sleeps", False):
        return

    def init(self, is_reader, context, notify_address, busy_loop_s: float = 0.0):
        original(self, is_reader, context, notify_address, 0.0)

    init.rollart_sleeps = True
    shm_broadcast.SpinCondition.__init__ = init
    shm_broadcast.SHM_READER_RECHECK_INTERVAL_MS = max(int(poll_ms), 1)
