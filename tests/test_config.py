import subprocess
import sys

import pytest
from pydantic import ValidationError

from rollart.config import RewardConfig, load_config, parse_sets


def field_errors(**overrides) -> str:
    with pytest.raises(ValidationError) as caught:
        load_config(None, **overrides)
    return str(caught.value)


def test_defaults_are_valid():
    config = load_config(None)
    assert config.algorithm.batch_size % config.algorithm.group_size == 0
    assert config.domains["frozenlake"].env == "frozenlake"


def test_group_size_below_two_names_the_field():
    message = field_errors(**{"algorithm.group_size": 1, "algorithm.batch_size": 8})
    assert "algorithm" in message and "group_size must be >= 2" in message


def test_batch_not_multiple_of_group():
    message = field_errors(**{"algorithm.group_size": 8, "algorithm.batch_size": 20})
    assert "batch_size (20) must be a multiple of group_size (8)" in message


def test_unknown_pool_names_the_field():
    message = field_errors(**{"domains.frozenlake.gen_pool": "h800"})
    assert "domains.frozenlake.gen_pool: unknown gen pool 'h800'" in message
    message = field_errors(**{"domains.frozenlake.gen_fallback": ["h20"]})
    assert "domains.frozenlake.gen_fallback: unknown gen pool 'h20'" in message


def test_speculation_is_per_gen_pool_and_maps_to_vllm():
    pools = [{"name": "cpu", "role": r} for r in ("env", "reward", "train")]
    config = load_config(None, pools=[*pools, {"name": "cpu", "role": "gen", "speculation": {
        "num_speculative_tokens": 8, "max_running_requests": 2}}])
    speculation = config.pool("gen", "cpu").speculation
    assert speculation.vllm_config() == {
        "method": "suffix", "num_speculative_tokens": 8, "suffix_decoding_max_tree_depth": 24,
        "suffix_decoding_max_cached_requests": 10_000, "suffix_decoding_max_spec_factor": 1.0,
        "suffix_decoding_min_token_prob": 0.1}
    message = field_errors(pools=[{"name": "cpu", "role": "env", "speculation": {}},
                                  {"name": "cpu", "role": "gen"}])
    assert "env pool 'cpu' has a speculation table; only gen pools speculate" in message


def test_an_http_reward_needs_an_http_url():
    message = field_errors(**{"domains.frozenlake.reward": {"kind": "http", "url": "x.com"}})
    assert "reward.url: kind 'http' needs an http:// or https:// url, got 'x.com'" in message
    config = load_config(None, **{"domains.frozenlake.reward": {
        "kind": "http", "url": "https://rm.example/score"}})
    assert config.domains["frozenlake"].reward.url == "https://rm.example/score"
    message = field_errors(**{"domains.frozenlake.reward": {"kind": "http_poll"}})
    assert "reward.url: kind 'http_poll' needs an http:// or https:// url, got None" in message
    message = field_errors(**{"domains.frozenlake.reward": {"kind": "lambda"}})
    assert "reward.function: kind 'lambda' needs the function's name" in message
    message = field_errors(**{"domains.frozenlake.reward": {"kind": "bad kind"}})
    assert "domains.frozenlake.reward.kind" in message


def test_a_polled_reward_gets_its_deadline_and_a_pool_its_slots():
    polled = RewardConfig(kind="http_poll", url="http://rm/jobs", deadline_s=900)
    assert polled.activity_timeout_s() > 900 and RewardConfig().activity_timeout_s() == 60
    config = load_config(None, pools=[
        {"name": "cpu", "role": r} for r in ("env", "gen", "train")] + [
        {"name": "cpu", "role": "reward", "replicas": 2, "concurrency": 200}])
    assert config.pool("reward", "cpu").slots() == 400
    assert config.pool("env", "cpu").slots() == 64


def test_unknown_key_is_rejected():
    message = field_errors(**{"algorithm.learning_rat": 0.1})
    assert "learning_rat" in message


def test_cli_refuses_bad_config_before_starting_anything(tmp_path):
    run_dir = tmp_path / "run"
    for setting, expected in [
        ("domains.frozenlake.env=nosuchenv",
         "domains.frozenlake.env: unknown environment 'nosuchenv'"),
        ("algorithm.group_size=1", "group_size must be >= 2"),
        ("domains.frozenlake.pool=gpu", "domains.frozenlake.pool: unknown env pool 'gpu'"),
        ("plugins=[\"no_such_plugin_module\"]", "plugins: cannot import 'no_such_plugin_module'"),
    ]:
        result = subprocess.run(
            [sys.executable, "-m", "rollart.workers.cli", "train", "--run-dir", str(run_dir),
             "--set", setting], capture_output=True, text=True, timeout=120,
        )
        assert result.returncode != 0
        assert expected in result.stderr, result.stderr
        assert not (run_dir / "temporal.db").exists()


def test_the_stack_starts_a_worker_per_replica_of_every_pool(tmp_path):
    from rollart.workers.stack import worker_commands

    config = load_config(None, pools=[
        {"name": "cpu", "role": r} for r in ("env", "gen", "train")] + [
        {"name": "cpu", "role": "reward", "replicas": 2}])
    commands = worker_commands(tmp_path / "run.toml", config)
    assert sorted(commands) == ["control", "env.cpu", "gen.cpu.r0", "reward.cpu.r0",
                                "reward.cpu.r1", "train.cpu"]
    assert commands["reward.cpu.r1"][-4:] == ["--role", "reward", "--pool", "cpu"]


def test_a_judge_pool_is_checked_against_the_domains_and_gen_pools():
    pools = [{"name": "cpu", "role": r} for r in ("env", "gen", "reward", "train")]
    judge = {"domains.frozenlake.reward": {"kind": "model"}}
    assert "kind 'model' needs a judge, but reward pool 'cpu' has no model" in field_errors(
        **judge)
    colocated = {"name": "judge", "role": "reward", "model": "policy", "colocate_with": "cpu"}
    assert "colocate_with needs simulation.enabled" in field_errors(pools=pools + [colocated])
    assert "colocates with unknown gen pool 'h20'" in field_errors(
        pools=pools + [{**colocated, "colocate_with": "h20"}])
    assert "colocates a judge with gen pool 'cpu' but has no model" in field_errors(
        pools=pools + [{**colocated, "model": None}])
    assert "only reward pools serve a judge" in field_errors(
        pools=[{**p, "model": "policy"} if p["role"] == "gen" else p for p in pools])


def test_trainer_ranks_are_real_ranks():
    assert load_config(None, **{"trainer.ranks": 2}).trainer.ranks == 2
    assert "trainer.ranks" in field_errors(**{"trainer.ranks": 0})
    message = field_errors(**{"trainer.ranks": 2, "simulation.enabled": True})
    assert "trainer.ranks: simulated compute prices the train step" in message


def test_the_megatron_backend_runs_one_rank():
    assert load_config(None, **{"trainer.backend": "megatron"}).trainer.backend == "megatron"
    message = field_errors(**{"trainer.backend": "megatron", "trainer.ranks": 2})
    assert "trainer.ranks: the megatron backend runs one rank" in message


def test_set_pairs_parse_json_values_and_keep_other_text_as_strings():
    assert parse_sets(["algorithm.redundancy=2", "algorithm.batch_order=first_complete",
                       "algorithm.tis_cap=null", "name=a=b"]) == {
        "algorithm.redundancy": 2, "algorithm.batch_order": "first_complete",
        "algorithm.tis_cap": None, "name": "a=b"}
    with pytest.raises(ValueError, match="--set expects key=value"):
        parse_sets(["algorithm.redundancy"])
