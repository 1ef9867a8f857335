"""An engine core that outlives the generation worker that started it exits.

A worker killed outright (the OOM killer, a launcher whose process group died) leaves its
engine core running under init, holding the model and its KV cache (~0.9 GB each for the tiny
model) while the restarted worker starts another. The kernel's parent-death signal cannot be
used: it fires when the *thread* that spawned the child ends, not the process. So the engine
core checks four times a second whether it still has the parent rollart.policy.engine named. A
spawned engine core learns it from its environment when vLLM loads this module's
`exit_with_parent` (the `vllm.general_plugins` entry point); a forked one inherits vLLM's
"plugins loaded" flag instead, so the worker arms a fork hook while it starts the engine.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator

PARENT_ENV = "ROLLART_ENGINE_PARENT_PID"
POLL_S = 0.25
_armed: list[int] = []  # the pid forked children watch, while an engine starts
_hooked: set[int] = set()


def exit_with_parent() -> None:
    parent = os.environ.get(PARENT_ENV)
    if parent is not None and int(parent) != os.getpid():
        exit_with(int(parent))


@contextlib.contextmanager
def forked_children_exit_with_this_process() -> Iterator[None]:
    if os.getpid() not in _hooked:
        _hooked.add(os.getpid())
        os.register_at_fork(after_in_child=_after_fork)
    _armed.append(os.getpid())
    try:
        yield
    finally:
        _armed.pop()


def _after_fork() -> None:
    if _armed:
        parent = _armed[-1]
        _armed.clear()
        exit_with(parent)


def exit_with(parent: int, role: str = "engine process",
              parent_role: str = "generation worker") -> None:
    """Exit this process once `parent` is no longer its parent (a thread polls)."""
    threading.Thread(target=_watch, args=(parent, role, parent_role),
                     name="rollart-parent-watch", daemon=True).start()


def _watch(parent: int, role: str, parent_role: str) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_S)
    print(f"rollart: {role} {os.getpid()} exits: its {parent_role} {parent} is gone",
          file=sys.stderr, flush=True)
    os._exit(1)
