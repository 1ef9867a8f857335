"""The built-in arithmetic domain and the adapters for third-party environments."""

from __future__ import annotations

import pytest

from rollart.envs import make_env
from rollart.envs.arithmetic import parse_answer


def test_arithmetic_scores_exact_answers_only():
    env = make_env("arithmetic", digits=2, terms=2)
    prompt, _ = env.reset(seed=3)
    left, right = (int("".join(part.split())) for part in prompt.removesuffix(" =").split("+"))
    total = sum(env.numbers)
    assert left + right == total and 10 <= left <= 99
    assert env.answer_length == 3  # up to 198: answers are three digits wide
    assert env.step(" ".join(f"{total:03d}")).info["success"]
    env.reset(seed=3)
    wrong = env.step(str(total + 1))
    assert wrong.terminated and wrong.reward == 0.0 and not wrong.info["invalid"]
    env.reset(seed=3)
    assert env.step("Left").info["invalid"]
    assert parse_answer("1 2") == 12 and parse_answer("") is None


def test_arithmetic_answer_width_follows_the_largest_sum():
    env = make_env("arithmetic", digits=1, terms=2, max_operand=4)
    assert env.answer_length == 1
    for seed in range(20):
        env.reset(seed=seed)
        assert sum(env.numbers) <= 8
    with pytest.raises(ValueError, match="does not fit"):
        make_env("arithmetic", digits=1, max_operand=12)


def test_arithmetic_problems_depend_on_the_seed_only():
    a, b = make_env("arithmetic"), make_env("arithmetic")
    assert a.reset(seed=5) == b.reset(seed=5)
    assert len({make_env("arithmetic").reset(seed=s)[0] for s in range(50)}) > 10


def test_gymnasium_frozenlake_through_the_adapter():
    env = make_env("gymnasium", id="FrozenLake-v1", make_kwargs={"is_slippery": False})
    assert env.action_vocabulary == ["Left", "Down", "Right", "Up"]
    observation, _ = env.reset(seed=0)
    assert observation == "state 0"
    for action in ["Down", "Down", "Right", "Right", "Down"]:
        assert not env.step(action).terminated
    final = env.step("Right")
    assert final.terminated and final.reward == 1.0 and final.info["success"]
    assert env.step("Jump").info["invalid"]


def test_gem_environment_through_the_adapter():
    env = make_env("gem", id="game:GuessTheNumber-v0-easy")
    observation, _ = env.reset(seed=3)
    assert "Guess The Number" in observation
    result = env.step("\\boxed{5}")
    assert isinstance(result.observation, str) and not result.terminated
