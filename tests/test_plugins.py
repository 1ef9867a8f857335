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


SIGNAL_PLUGIN = textwrap.dedent('''
    from rollart.envs import StepResult, register_env

    @register_env("signal_flag")
    class SignalFlag:
        """One turn: the flag's colour says which way to go. Its words are in no built-in
        domain, and it declares no vocabulary."""
        action_vocabulary = ["Left", "Right"]
        deterministic = True

        def reset(self, seed):
            self.colour = ["crimson", "azure"][seed % 2]
            return f"the flag is {self.colour}", {}

        def step(self, action):
            won = action.strip() == {"crimson": "Left", "azure": "Right"}[self.colour]
            return StepResult("", float(won), True, info={"success": won})
''')


def signal_config(tmp_path) -> RunConfig:
    plugin = tmp_path / "signal_envs.py"
    plugin.write_text(SIGNAL_PLUGIN)
    return RunConfig(run_dir=str(tmp_path / "run"), plugins=[str(plugin)],
                     domains={"signal": {"env": "signal_flag", "max_turns": 1}})


def learn_signal(model_path: str, tmp_path, iterations: int = 20) -> list[float]:
    """GRPO on the real trainer, the batch sampled by its own model in process (one turn, the
    constrained distribution the engine samples from): success per iteration."""
    import torch

    from rollart.blobs import LocalBlobs
    from rollart.config import AlgorithmConfig
    from rollart.contracts import TrainSample
    from rollart.policy.trainer import Trainer
    from rollart.store import TrajectoryStore, TurnRecord

    algorithm = AlgorithmConfig(group_size=8, batch_size=32, minibatches=1)
    trainer = Trainer(model_path, algorithm.learning_rate, seed=0, threads=1)
    tokenizer, store = trainer.tokenizer, TrajectoryStore(LocalBlobs(tmp_path / "store"))
    actions = ["Left", "Right"]
    allowed = [tokenizer.convert_tokens_to_ids(a) for a in actions]
    generator, curve = torch.Generator().manual_seed(0), []
    for iteration in range(iterations):
        samples, wins = [], 0
        for group in range(algorithm.groups_per_batch):
            env = make_env("signal_flag")
            observation = tokenizer.encode(env.reset(seed=iteration * 7 + group)[0],
                                           add_special_tokens=False)
            with torch.no_grad():
                logits = trainer.model(input_ids=torch.tensor([observation])).logits[0, -1]
            probs = torch.softmax(logits[allowed].float(), dim=-1)
            for member in range(algorithm.group_size):
                choice = int(torch.multinomial(probs, 1, generator=generator))
                tid = f"i{iteration}g{group}t{member}"
                store.write_turn(tid, TurnRecord(
                    turn=0, observation_ids=observation, sampled_ids=[allowed[choice]],
                    logprobs=[float(probs[choice].log())], versions=[trainer.version],
                    allowed_ids=allowed))
                won = env.step(actions[choice]).reward
                wins += won
                samples.append(TrainSample(trajectory_id=tid, group_id=f"i{iteration}g{group}",
                                           reward=won, turns=1))
        trainer.train_step(store, samples, algorithm, 1.0)
        curve.append(wins / algorithm.batch_size)
    return curve


def test_the_default_policy_spells_a_plugin_envs_words_and_learns_from_them(tmp_path,
                                                                          monkeypatch):
    from transformers import AutoTokenizer

    from rollart.policy.model import policy_model_path, resolve_model_path

    monkeypatch.setenv("ROLLART_CACHE", str(tmp_path / "cache"))
    builtin = resolve_model_path(None)
    assert policy_model_path(RunConfig()) == builtin  # built-in domains: the default, as ever
    config = signal_config(tmp_path)
    covering = policy_model_path(config)
    assert covering != builtin and policy_model_path(config) == covering  # one per vocabulary
    tokenizer = AutoTokenizer.from_pretrained(covering)
    for text in ("the flag is crimson", "the flag is azure", "3 higher, found!", "Left"):
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.unk_token_id not in ids and tokenizer.decode(ids) == text
    assert len(tokenizer.encode("Left", add_special_tokens=False)) == 1  # actions stay one token
    # what the words are worth: the built-in vocabulary reads both flags as <unk> and cannot do
    # better than chance; the covering one tells them apart and learns
    blind = AutoTokenizer.from_pretrained(builtin)
    assert (blind.encode("the flag is crimson", add_special_tokens=False)
            == blind.encode("the flag is azure", add_special_tokens=False))
    assert sum(learn_signal(covering, tmp_path / "a")[-5:]) / 5 >= 0.9
    assert sum(learn_signal(builtin, tmp_path / "b")[-5:]) / 5 <= 0.75


def test_a_declared_vocabulary_becomes_whole_tokens(tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    from rollart.policy.model import policy_model_path

    monkeypatch.setenv("ROLLART_CACHE", str(tmp_path / "cache"))
    plugin = tmp_path / "my_envs.py"
    plugin.write_text(readme_block("python", "# my_envs.py"))
    example = tomllib.loads(readme_block("toml", "# guess.toml"))
    config = RunConfig(plugins=[str(plugin)], domains=example["domains"])
    tokenizer = AutoTokenizer.from_pretrained(policy_model_path(config))
    assert tokenizer.tokenize("guess a digit") == ["guess", "a", "digit"]
    assert tokenizer.tokenize("7 lower") == ["7", "lower"]
