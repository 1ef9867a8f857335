import random

from rollart.envs import make_env
from rollart.envs.frozenlake import (
    INVALID_MESSAGE,
    parse_action,
    random_map,
    random_walk_success,
)


def test_shortest_path_reaches_the_goal():
    env = make_env("frozenlake")
    observation, _ = env.reset(seed=0)
    assert observation.startswith("P F F F")
    for action in ["Down", "Down", "Right", "Right", "Down"]:
        assert not env.step(action).terminated
    final = env.step("Right")
    assert final.terminated and final.reward == 1.0 and final.info["success"]


def test_hole_ends_the_episode_without_reward():
    env = make_env("frozenlake")
    env.reset(seed=0)
    env.step("Right")
    result = env.step("Down")
    assert result.terminated and result.reward == 0.0 and not result.info["success"]


def test_garbage_output_costs_a_turn_not_a_crash():
    env = make_env("frozenlake")
    first, _ = env.reset(seed=0)
    result = env.step("<eos> | | G")
    assert result.observation == f"{INVALID_MESSAGE} {first}"
    assert not result.terminated and result.info["invalid"]


def test_action_parsing():
    assert parse_action("I go <answer>right</answer>") == "Right"
    assert parse_action("Up Down") == "Up"
    assert parse_action("nothing") is None


def test_random_maps_are_solvable_and_seeded():
    for seed in range(50):
        grid = random_map(4, random.Random(seed))
        assert grid == random_map(4, random.Random(seed))
        assert grid[0][0] == "S" and grid[-1][-1] == "G"


def test_random_policy_baseline_is_low():
    assert random_walk_success(20_000) < 0.02
