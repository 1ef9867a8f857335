"""Text environments with gym-style reset/step, registered by name."""

from rollart.envs.base import Env, StepResult, make_env, register_env, registered_envs
from rollart.envs.corridor import CorridorEnv
from rollart.envs.frozenlake import FrozenLakeEnv

__all__ = [
    "CorridorEnv",
    "Env",
    "FrozenLakeEnv",
    "StepResult",
    "make_env",
    "register_env",
    "registered_envs",
]
