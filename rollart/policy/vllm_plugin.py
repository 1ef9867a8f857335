"""Loaded by vLLM in each of its processes through the `vllm.general_plugins` entry point: an
engine core that outlives the generation worker that started it exits.

A worker killed outright (the OOM killer, a launcher whose process group died) leaves its
engine core running under init, holding the model and its KV cache (~0.9 GB each for the tiny
model) while the restarted worker starts another. The kernel's parent-death signal cannot be
used: it fires when the *thread* that spawned the child ends, not the process. So the engine
core checks once a second whether it still has the parent rollart.policy.engine named.
"""

from __future__ import annotations

import os
import sys
import threading
import time

PARENT_ENV = "ROLLART_ENGINE_PARENT_PID"
POLL_S = 1.0


def exit_with_parent() -> None:
    parent = os.environ.get(PARENT_ENV)
    if parent is None or int(parent) == os.getpid():
        return  # an engine rollart did not start, or the generation worker itself
    threading.Thread(target=_watch, args=(int(parent),), name="rollart-parent-watch",
                     daemon=True).start()


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_S)
    print(f"rollart: engine process {os.getpid()} exits: its generation worker {parent} is "
          "gone", file=sys.stderr, flush=True)
    os._exit(1)
