"""Multi-turn FrozenLake as a text environment (the built-in default task).

The agent sees the whole grid each turn with its own cell marked `P` and answers with one of
Left/Down/Right/Up. Reaching `G` pays 1 and ends the episode; a hole `H` ends it with 0. An answer
that names no action leaves the agent where it was and says so, so garbage model output costs a
turn instead of crashing anything.
"""

from __future__ import annotations

import random
import re
from typing import Any

from rollart.envs.base import StepResult, register_env

ACTIONS = ["Left", "Down", "Right", "Up"]
MOVES = {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}
SLIPS = {"Left": ("Down", "Up"), "Right": ("Down", "Up"), "Up": ("Left", "Right"),
         "Down": ("Left", "Right")}
STANDARD_4X4 = ["SFFF", "FHFH", "FFFH", "HFFG"]
INVALID_MESSAGE = "Invalid action"
OBSERVATION_WORDS = ["S", "F", "H", "G", "P", "|", "Invalid", "action"]
_ACTION_PATTERN = re.compile(r"\b(left|down|right|up)\b", re.IGNORECASE)


def parse_action(text: str) -> str | None:
    """The first action word in the model's answer, or None."""
    match = _ACTION_PATTERN.search(text)
    return match.group(1).capitalize() if match else None


def random_map(size: int, rng: random.Random, hole_share: float = 0.2) -> list[str]:
    """A random map whose goal is reachable from the start."""
    while True:
        cells = [["H" if rng.random() < hole_share else "F" for _ in range(size)]
                 for _ in range(size)]
        cells[0][0], cells[-1][-1] = "S", "G"
        grid = ["".join(row) for row in cells]
        if _reachable(grid):
            return grid


def _reachable(grid: list[str]) -> bool:
    size, seen, todo = len(grid), {(0, 0)}, [(0, 0)]
    while todo:
        r, c = todo.pop()
        if grid[r][c] == "G":
            return True
        for dr, dc in MOVES.values():
            nr, nc = r + dr, c + dc
            if 0 <= nr < size and 0 <= nc < size and (nr, nc) not in seen and grid[nr][nc] != "H":
                seen.add((nr, nc))
                todo.append((nr, nc))
    return False


def random_walk_success(episodes: int, max_turns: int = 10, seed: int = 0) -> float:
    """The baseline a learned policy is compared with: uniform random actions on the default
    map."""
    rng, wins = random.Random(seed), 0
    for episode in range(episodes):
        env = FrozenLakeEnv()
        env.reset(seed=episode)
        for _ in range(max_turns):
            result = env.step(rng.choice(ACTIONS))
            if result.terminated:
                wins += result.reward > 0
                break
    return wins / episodes


@register_env("frozenlake")
class FrozenLakeEnv:
    action_vocabulary = ACTIONS
    vocabulary = OBSERVATION_WORDS
    deterministic = True  # seed and actions determine it: rebuilt if its worker dies

    def __init__(self, map_name: str = "4x4", random_maps: bool = False, size: int = 4,
                 is_slippery: bool = False) -> None:
        if map_name != "4x4" and not random_maps:
            raise ValueError(f"unknown FrozenLake map {map_name!r}; use '4x4' or random_maps")
        self.random_maps, self.size, self.is_slippery = random_maps, size, is_slippery
        self.grid = STANDARD_4X4
        self.pos = (0, 0)
        self.rng = random.Random(0)

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        self.rng = random.Random(seed)
        if self.random_maps:
            self.grid = random_map(self.size, self.rng)
        self.pos = (0, 0)
        return self.render(), {"success": False}

    def step(self, action: str) -> StepResult:
        move = parse_action(action)
        if move is None:
            return StepResult(f"{INVALID_MESSAGE} {self.render()}", 0.0, False,
                              info={"success": False, "invalid": True})
        if self.is_slippery:
            move = self.rng.choice([move, *SLIPS[move]])
        dr, dc = MOVES[move]
        size = len(self.grid)
        row, col = self.pos[0] + dr, self.pos[1] + dc
        self.pos = (min(max(row, 0), size - 1), min(max(col, 0), size - 1))
        cell = self.grid[self.pos[0]][self.pos[1]]
        success = cell == "G"
        return StepResult(self.render(), 1.0 if success else 0.0, cell in "GH",
                          info={"success": success, "invalid": False})

    def render(self) -> str:
        rows = []
        for r, row in enumerate(self.grid):
            rows.append(" ".join("P" if (r, c) == self.pos else cell for c, cell in enumerate(row)))
        return " | ".join(rows)
