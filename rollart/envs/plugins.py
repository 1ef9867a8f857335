"""Environments from outside rollart: modules or files named in the config, and packages that
declare entry points.

A plugin module registers its classes with `@register_env` / `@register_reward` when imported;
`plugins = ["my_envs", "/path/to/envs.py"]` in the run config makes every worker import it first.
A pip-installed package can instead declare
`[project.entry-points."rollart.envs"] guess = "my_pkg.envs:GuessEnv"`.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from importlib.metadata import entry_points
from pathlib import Path

ENTRY_POINT_GROUP = "rollart.envs"


class PluginError(ImportError):
    pass


def load_plugins(plugins: list[str]) -> None:
    """Import each plugin once; a missing or broken one is a clear error naming it."""
    for plugin in plugins:
        try:
            _import(plugin)
        except Exception as err:
            raise PluginError(f"plugins: cannot import {plugin!r}: "
                              f"{type(err).__name__}: {err}") from err


def _import(plugin: str) -> None:
    if not plugin.endswith(".py"):
        importlib.import_module(plugin)
        return
    path = Path(plugin).expanduser().resolve()
    name = f"rollart_plugin_{path.stem}_{abs(hash(str(path))):x}"
    if name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or not path.is_file():
        raise FileNotFoundError(f"no such file {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise


def entry_point_envs() -> dict[str, object]:
    """Environment factories that installed packages declare, by name (loaded on first use)."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
