from pathlib import Path

from rollart.config import RunConfig, load_config

EXAMPLES = Path(__file__).parent.parent / "examples"


def test_example_config_is_the_default_spelled_out():
    example = load_config(EXAMPLES / "frozenlake.toml")
    default = RunConfig()
    assert example.model_dump(exclude={"env"}) == default.model_dump(exclude={"env"})
    assert example.env.model_dump(exclude={"kwargs"}) == default.env.model_dump(exclude={"kwargs"})
