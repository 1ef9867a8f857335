"""Environments plugged in from outside rollart: the README's example served end to end, a file
named in the config, a package entry point."""

from __future__ import annotations

import re
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
from conftest import make_config

from rollart.config import RunConfig
from rollart.contracts import TrajectoryResult, TrajectorySpec
from rollart.envs import load_plugins, make_env, registered_envs
from rollart.envs.plugins import PluginError
from rollart.workers.fleet import in_process_fleet
from rollart.workflows.trajectory import TrajectoryWorkflow

README = Path(__file__).parent.parent / "README.md"


def readme_block(language: str, first_line: str) -> str:
    blocks = re.findall(rf"```{language}\n(.*?)```", README.read_text(), re.DOTALL)
    return next(b for b in blocks if b.startswith(first_line))


@pytest.mark.asyncio(loop_scope="session")
async def test_readme_example_plugin_trains_as_activities(temporal_server, engine, tmp_path):
    plugin = tmp_path / "my_envs.py"
    plugin.write_text(readme_block("python", "# my_envs.py"))
    example = tomllib.loads(readme_block("toml", "# guess.toml"))
    example["plugins"] = [str(plugin)]
    RunConfig.model_validate(example)  # the README's config is valid as written
    config = make_config(temporal_server, tmp_path, plugins=[str(plugin)],
                         domains=example["domains"])
    async with in_process_fleet(config, engine, ("control", "env", "reward", "gen")) as client:
        results = [await client.execute_workflow(
            TrajectoryWorkflow.run,
            TrajectorySpec.for_domain(config, "guess", f"guess-{seed}", "g", seed=seed),
            id=f"guess-{seed}", task_queue=config.temporal.control_queue,
            result_type=TrajectoryResult) for seed in range(3)]
    assert all(r.status == "completed" and 1 <= r.turns <= 4 for r in results)
    assert all(r.reward == float(r.success) for r in results)


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
