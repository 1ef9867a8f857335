"""The environment interface and its registry.

An environment is any class with gym-style `reset(seed) -> (observation, info)` and
`step(action_text) -> StepResult`, text in and text out, registered under a name with
`@register_env("name")`. Env workers look environments up here by the name in the run config.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class StepResult:
    observation: str
    reward: float
    terminated: bool
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)


class Env(Protocol):
    action_vocabulary: list[str] | None
    """The complete set of valid action strings, or None when actions are free text."""

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]: ...

    def step(self, action: str) -> StepResult: ...


class UnknownEnvironmentError(KeyError):
    pass


_REGISTRY: dict[str, Callable[..., Env]] = {}


def register_env(name: str) -> Callable[[Callable[..., Env]], Callable[..., Env]]:
    def decorate(factory: Callable[..., Env]) -> Callable[..., Env]:
        _REGISTRY[name] = factory
        return factory

    return decorate


def registered_envs() -> list[str]:
    return sorted(_REGISTRY)


def make_env(name: str, **kwargs: Any) -> Env:
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise UnknownEnvironmentError(
            f"unknown environment {name!r}; registered: {registered_envs()}"
        ) from None
    return factory(**kwargs)
