"""Thin adapters that serve third-party environments as rollart text environments.

`gymnasium` wraps any gymnasium env with a discrete action space (FrozenLake-v1, Taxi-v3, ...):
actions are named words, observations become text. `gem` wraps a GEM environment, which is
already text in, text out. Both libraries are optional and imported only when an env is made.
"""

from __future__ import annotations

from typing import Any

from rollart.envs.base import StepResult, register_env

FROZENLAKE_ACTIONS = ["Left", "Down", "Right", "Up"]


@register_env("gymnasium")
class GymnasiumEnv:
    """kwargs: `id` (e.g. "FrozenLake-v1"), `make_kwargs` for gymnasium.make, `action_names` (one
    word per discrete action, in index order; FrozenLake's default to Left/Down/Right/Up)."""

    def __init__(self, id: str, make_kwargs: dict[str, Any] | None = None,
                 action_names: list[str] | None = None) -> None:
        import gymnasium

        self.env = gymnasium.make(id, **(make_kwargs or {}))
        count = self.env.action_space.n
        if action_names is None:
            action_names = (FROZENLAKE_ACTIONS if id.startswith("FrozenLake")
                            else [str(a) for a in range(count)])
        if len(action_names) != count:
            raise ValueError(f"gymnasium {id}: {len(action_names)} action_names for {count} "
                             "actions")
        self.action_vocabulary = list(action_names)

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        observation, info = self.env.reset(seed=seed)
        return self._text(observation), {"success": False, **_plain(info)}

    def step(self, action: str) -> StepResult:
        words = action.split()
        if not words or words[0] not in self.action_vocabulary:
            return StepResult(f"Invalid action {action!r}", 0.0, False,
                              info={"success": False, "invalid": True})
        observation, reward, terminated, truncated, info = self.env.step(
            self.action_vocabulary.index(words[0]))
        return StepResult(self._text(observation), float(reward), bool(terminated),
                          bool(truncated), {"success": float(reward) > 0, **_plain(info)})

    def close(self) -> None:
        self.env.close()

    def _text(self, observation: Any) -> str:
        return f"state {observation}"


@register_env("gem")
class GemEnv:
    """kwargs: `id`, a GEM environment id such as "game:GuessTheNumber-v0-easy"."""

    action_vocabulary = None

    def __init__(self, id: str, **make_kwargs: Any) -> None:
        import gem

        self.env = gem.make(id, **make_kwargs)

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        observation, info = self.env.reset(seed=seed)
        return str(observation), {"success": False, **_plain(info)}

    def step(self, action: str) -> StepResult:
        observation, reward, terminated, truncated, info = self.env.step(action)
        return StepResult(str(observation), float(reward), bool(terminated), bool(truncated),
                          {"success": float(reward) > 0, **_plain(info)})


def _plain(info: dict[str, Any]) -> dict[str, Any]:
    """The JSON-friendly part of an info dict (it travels through workflow histories)."""
    return {k: v for k, v in info.items() if isinstance(v, str | int | float | bool | None)}
