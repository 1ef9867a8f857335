"""When trajectories should take their turns together: the rule rollout_unit auto follows."""

from __future__ import annotations

import random

from rollart.workflows.scheduling import (
    KEPT_STEPS,
    MIN_STEPS,
    batch_rollout,
    lockstep_wait_s,
    remember_steps,
)


def lognormal_steps(sigma: float, count: int = 256, median: float = 0.05) -> list[float]:
    rng = random.Random(0)
    return [rng.lognormvariate(0.0, sigma) * median for _ in range(count)]


def test_lockstep_costs_what_the_slowest_step_adds_over_the_mean():
    assert lockstep_wait_s([0.05] * 100, 32) == 0.0
    steps = [0.01] * 99 + [1.0]
    assert lockstep_wait_s(steps, 1) <= 0.0  # one trajectory waits for no other
    assert lockstep_wait_s(steps, 200) > 0.9  # one in a hundred is slow: 200 meet it
    calm, wild = lognormal_steps(0.25), lognormal_steps(1.5)
    assert 0.005 < lockstep_wait_s(calm, 32) < 0.05 < 0.3 < lockstep_wait_s(wild, 32)
    assert lockstep_wait_s(calm, 8) < lockstep_wait_s(calm, 32)


def test_auto_batches_only_where_the_wait_is_below_the_orchestration_it_saves():
    calm, wild = {"lake": lognormal_steps(0.25)}, {"lake": lognormal_steps(1.5)}
    assert batch_rollout("auto", calm, ["lake"], 32, 0.04)
    assert not batch_rollout("auto", wild, ["lake"], 32, 0.04)
    assert not batch_rollout("auto", calm, ["lake"], 32, 0.001)  # a fast orchestrator
    assert not batch_rollout("auto", {}, ["lake"], 32, 0.04)  # nothing measured yet
    few = {"lake": [0.05] * (MIN_STEPS - 1)}
    assert not batch_rollout("auto", few, ["lake"], 32, 0.04)
    assert not batch_rollout("auto", {**calm, "math": [0.05] * 10}, ["lake", "math"], 32, 0.04)
    assert batch_rollout("batch", {}, ["lake"], 32, 0.0)
    assert not batch_rollout("trajectory", calm, ["lake"], 32, 1.0)


def test_the_kept_steps_stay_bounded_and_recent():
    steps: dict[str, list[float]] = {}
    for k in range(KEPT_STEPS):
        remember_steps(steps, "lake", [float(k), float(k)])
    remember_steps(steps, "lake", [])
    assert len(steps["lake"]) == KEPT_STEPS and steps["lake"][-1] == KEPT_STEPS - 1
