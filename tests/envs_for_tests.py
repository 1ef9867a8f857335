"""Environments that exist only to exercise rollart's failure and scaling paths."""

from __future__ import annotations

import itertools
import os
import threading
import time

from rollart.activities.reward import episode_return, register_reward
from rollart.contracts import RewardRequest, RewardResult
from rollart.envs import FrozenLakeEnv, StepResult, register_env

_instances = itertools.count()


@register_env("exploding")
class ExplodingFrozenLake(FrozenLakeEnv):
    """FrozenLake whose every `every`-th instance raises on its first step."""

    def __init__(self, every: int = 4, **kwargs) -> None:
        super().__init__(**kwargs)
        self.explodes = next(_instances) % every == 0

    def step(self, action: str) -> StepResult:
        if self.explodes:
            raise RuntimeError("boom: the simulator crashed")
        return super().step(action)


@register_env("broken_reset")
class BrokenReset(FrozenLakeEnv):
    def reset(self, seed: int):
        raise ConnectionError("cannot start the sandbox")


@register_env("slow")
class SlowStep(FrozenLakeEnv):
    """Each step takes `delay_s`; remembers which episodes were closed."""

    closed: list[str] = []

    def __init__(self, delay_s: float = 3.0, **kwargs) -> None:
        super().__init__(**kwargs)
        self.delay_s = delay_s

    def step(self, action: str) -> StepResult:
        time.sleep(self.delay_s)
        return super().step(action)

    def close(self) -> None:
        SlowStep.closed.append(str(id(self)))


@register_env("counting")
class CountingCorridor:
    """Never ends; counts the steps it really took, per seed (how tests tell a retried step from
    a step taken twice)."""

    action_vocabulary = ["Left", "Right"]
    steps: dict[int, int] = {}

    def reset(self, seed: int):
        self.seed = seed
        CountingCorridor.steps[seed] = 0
        return "F P F", {}

    def step(self, action: str) -> StepResult:
        CountingCorridor.steps[self.seed] += 1
        return StepResult("F P F", 0.0, False)


@register_env("chatty")
class Chatty:
    """Answers every step with `size` characters."""

    action_vocabulary = ["Left", "Right"]

    def __init__(self, size: int = 100) -> None:
        self.size = size

    def reset(self, seed: int):
        return "F P F", {}

    def step(self, action: str) -> StepResult:
        return StepResult("F " * (self.size // 2), 0.0, False)


@register_env("replayable")
class Replayable(FrozenLakeEnv):
    """FrozenLake for the replay test: the next `fail_next` instances raise on their first step;
    instances made while `hold` is set wait for `gate` before each step."""

    fail_next = 0
    hold = False
    gate = threading.Event()
    _lock = threading.Lock()

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        with Replayable._lock:
            self.explodes = Replayable.fail_next > 0
            Replayable.fail_next -= self.explodes
        self.held = Replayable.hold

    def step(self, action: str) -> StepResult:
        if self.explodes:
            raise RuntimeError("the simulator crashed")
        if self.held:
            Replayable.gate.wait()
        return super().step(action)


@register_env("walk")
class Walk:
    """Deterministic: each action moves the walker, and the observation shows where it is."""

    action_vocabulary = ["Left", "Right"]
    deterministic = True

    def reset(self, seed: int):
        self.position = seed % 5
        return self.observation(), {}

    def step(self, action: str) -> StepResult:
        self.position = max(0, min(4, self.position + (1 if action == "Right" else -1)))
        return StepResult(self.observation(), 0.0, False)

    def observation(self) -> str:
        return " ".join("P" if cell == self.position else "F" for cell in range(5))


REWARD_HANGS_ENV = "ROLLART_TEST_REWARD_HANGS"


@register_env("reward_hangs")
class RewardHangs(FrozenLakeEnv):
    """FrozenLake whose reward rule hangs in a reward worker started with REWARD_HANGS_ENV set
    (the test kills that worker mid-score); elsewhere it is the episode's return."""


@register_reward("reward_hangs")
def hanging_reward(request: RewardRequest) -> RewardResult:
    if os.environ.get(REWARD_HANGS_ENV):
        time.sleep(600)
    return episode_return(request)
