"""The built-in arithmetic domain, third-party adapters, and environments plugged in from outside
rollart (a file named in the config, a package entry point)."""

from __future__ import annotations

import sys
import textwrap

import pytest

from rollart.envs import load_plugins, make_env, registered_envs
from rollart.envs.arithmetic import parse_answer
from rollart.envs.plugins import PluginError


def test_arithmetic_scores_exact_answers_only():
    env = make_env("arithmetic", digits=2, terms=2)
    prompt, _ = env.reset(seed=3)
    left, right = (int("".join(part.split())) for part in prompt.removesuffix(" =").split("+"))
    total = sum(env.numbers)
    assert left + right == total and 10 <= left <= 99
    assert env.step(" ".join(str(total))).info["success"]
    env.reset(seed=3)
    wrong = env.step(str(total + 1))
    assert wrong.terminated and wrong.reward == 0.0 and not wrong.info["invalid"]
    env.reset(seed=3)
    assert env.step("Left").info["invalid"]
    assert parse_answer("1 2") == 12 and parse_answer("") is None


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


PLUGIN = textwrap.dedent('''
    from rollart.envs import StepResult, register_env

    @register_env("echo_guess")
    class EchoGuess:
        """Guess the secret word; the prompt gives it away."""
        action_vocabulary = ["Left", "Right"]

        def reset(self, seed):
            self.secret = ["Left", "Right"][seed % 2]
            return f"say {self.secret}", {}

        def step(self, action):
            won = action.strip() == self.secret
            return StepResult("", float(won), True, info={"success": won})
''')


def test_plugin_file_outside_the_repository(tmp_path):
    plugin = tmp_path / "my_envs.py"
    plugin.write_text(PLUGIN)
    load_plugins([str(plugin)])
    load_plugins([str(plugin)])  # idempotent
    env = make_env("echo_guess")
    observation, _ = env.reset(seed=1)
    assert observation == "say Right" and env.step("Right").reward == 1.0


def test_missing_or_broken_plugins_name_themselves(tmp_path):
    with pytest.raises(PluginError, match="cannot import 'no_such_module'"):
        load_plugins(["no_such_module"])
    broken = tmp_path / "broken_envs.py"
    broken.write_text("raise RuntimeError('half-written plugin')\n")
    with pytest.raises(PluginError, match="half-written plugin"):
        load_plugins([str(broken)])


def test_entry_point_environment(tmp_path, monkeypatch):
    """A pip-installed package declares `[project.entry-points."rollart.envs"]`; here the
    installed metadata is written by hand on a path entry."""
    package = tmp_path / "guess_pkg"
    package.mkdir()
    (package / "__init__.py").write_text(PLUGIN.replace('@register_env("echo_guess")\n', ""))
    info = tmp_path / "guess_pkg-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: guess-pkg\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[rollart.envs]\nguess = guess_pkg:EchoGuess\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "guess" in registered_envs()
    env = make_env("guess")
    assert env.reset(seed=0)[0] == "say Left"
    monkeypatch.delitem(sys.modules, "guess_pkg", raising=False)
