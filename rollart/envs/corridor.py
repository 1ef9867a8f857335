"""A fixed-length environment for measuring orchestration: it never ends on its own, so every
trajectory runs exactly `max_turns` turns, and its observations are tiny."""

from __future__ import annotations

from typing import Any

from rollart.envs.base import StepResult, register_env


@register_env("corridor")
class CorridorEnv:
    action_vocabulary = ["Left", "Right"]
    vocabulary = ["F", "P"]
    deterministic = True  # seed and actions determine it: rebuilt if its worker dies

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        return "F P F", {}

    def step(self, action: str) -> StepResult:
        return StepResult("F P F", 0.0, False)
