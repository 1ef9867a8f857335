"""Text environments with gym-style reset/step, registered by name."""

from rollart.envs.adapters import GemEnv, GymnasiumEnv
from rollart.envs.arithmetic import ArithmeticEnv
from rollart.envs.base import Env, StepResult, make_env, register_env, registered_envs
from rollart.envs.corridor import CorridorEnv
from rollart.envs.frozenlake import FrozenLakeEnv
from rollart.envs.plugins import load_plugins

__all__ = [
    "ArithmeticEnv",
    "CorridorEnv",
    "GemEnv",
    "GymnasiumEnv",
    "load_plugins",
    "Env",
    "FrozenLakeEnv",
    "StepResult",
    "make_env",
    "register_env",
    "registered_envs",
]
