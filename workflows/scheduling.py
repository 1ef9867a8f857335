"""Whether the trajectories the supply starts together should take their turns together.

Trajectory-level scheduling lets each trajectory run at its own env's pace, but every turn of
every trajectory costs the orchestrator its own workflow tasks; a batch shares them, and pays
instead with each turn waiting for its slowest env step. Which costs more is read off the env
steps measured so far, domain by domain."""

from __future__ import annotations

import math
from statistics import fmean

KEPT_STEPS = 256
MIN_STEPS = 32


def lockstep_wait_s(steps: list[float], trajectories: int) -> float:
    """What lockstep adds to a turn of `trajectories`: their expected slowest env step over the
    mean one, from measured steps (the 1 - 1/(n+1) quantile estimates the largest of n draws,
    whatever the distribution's tail)."""
    if not steps:
        return math.inf
    ordered = sorted(steps)
    rank = min(len(ordered) - 1, int(len(ordered) * (1 - 1 / (trajectories + 1))))
    return ordered[rank] - fmean(ordered)


def batch_rollout(unit: str, steps_by_domain: dict[str, list[float]], domains: list[str],
                  trajectories: int, turn_overhead_s: float) -> bool:
    """unit "auto": batch once every domain has MIN_STEPS measured steps and lockstep would add
    no more to a turn than the orchestration it saves."""
    if unit != "auto":
        return unit == "batch"
    return all(len(steps_by_domain.get(domain, [])) >= MIN_STEPS
               and lockstep_wait_s(steps_by_domain[domain], trajectories) <= turn_overhead_s
               for domain in domains)


def remember_steps(steps_by_domain: dict[str, list[float]], domain: str,
                   steps: list[float]) -> None:
    """Keep a domain's most recent KEPT_STEPS step times (the workflow's state stays bounded)."""
    if steps:
        steps_by_domain[domain] = (steps_by_domain.get(domain, []) + steps)[-KEPT_STEPS:]
