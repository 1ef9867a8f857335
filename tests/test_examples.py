from pathlib import Path

from rollart.config import RunConfig, load_config

EXAMPLES = Path(__file__).parent.parent / "examples"


def test_example_config_is_the_default_spelled_out():
    example = load_config(EXAMPLES / "frozenlake.toml")
    default = RunConfig()
    assert example.model_dump(exclude={"domains"}) == default.model_dump(exclude={"domains"})
    lake, default_lake = example.domains["frozenlake"], default.domains["frozenlake"]
    assert lake.model_dump(exclude={"kwargs"}) == default_lake.model_dump(exclude={"kwargs"})


def test_multitask_example_is_valid():
    config = load_config(EXAMPLES / "multitask.toml")
    assert set(config.domains) == {"frozenlake", "arithmetic"}
    assert {p.hardware for p in config.pools if p.role == "gen"} == {"h800", "h20"}


def test_tensor_parallel_example_is_the_default_with_sharded_replicas():
    config, default = load_config(EXAMPLES / "tensor_parallel.toml"), RunConfig()
    assert config.pool("gen", "cpu").tensor_parallel_size == 2
    assert config.model_dump(exclude={"pools"}) == default.model_dump(exclude={"pools"})
    assert [p.model_dump(exclude={"tensor_parallel_size"}) for p in config.pools] == [
        p.model_dump(exclude={"tensor_parallel_size"}) for p in default.pools]
