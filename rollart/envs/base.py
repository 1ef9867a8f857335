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
    # Optional: `vocabulary: list[str]`, the words its observations are made of (whole tokens
    # of the tiny default policy; it spells any other word in characters);
    # `answer_alphabet: list[str]`, the tokens a free-text answer is made of, with
    # `answer_length: int` when answers have a fixed width; `close()`, called when the episode
    # ends or is abandoned; `deterministic = True` when the seed and the actions taken determine
    # the episode (observations, rewards, ends): an episode whose env worker died is then
    # rebuilt on another worker by replaying its actions instead of failing.

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
    from rollart.envs.plugins import entry_point_envs

    return sorted({*_REGISTRY, *entry_point_envs()})


def make_env(name: str, **kwargs: Any) -> Env:
    return _factory(name)(**kwargs)


def _factory(name: str) -> Callable[..., Env]:
    factory = _REGISTRY.get(name)
    if factory is None:
        from rollart.envs.plugins import entry_point_envs

        entry_point = entry_point_envs().get(name)
        if entry_point is None:
            raise UnknownEnvironmentError(
                f"unknown environment {name!r}; registered: {registered_envs()}")
        factory = _REGISTRY.setdefault(name, entry_point.load())
    return factory


def declared_words(name: str) -> list[str] | None:
    """The words env `name` declares it uses (vocabulary, actions, answer alphabet), or None
    when it declares no `vocabulary`."""
    try:
        factory = _factory(name)
    except UnknownEnvironmentError:
        return None
    vocabulary = getattr(factory, "vocabulary", None)
    if vocabulary is None:
        return None
    return [*vocabulary, *(getattr(factory, "action_vocabulary", None) or []),
            *(getattr(factory, "answer_alphabet", None) or [])]
