"""The repository's layout holds: planes import downward only, every activity name is written
once, and both install paths (editable, wheel) give `rollart.workflows` etc. and nothing named
`workflows` at the top level."""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import pkgutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from test_plugins import readme_block

from rollart.contracts import Activity

ROOT = Path(__file__).parent.parent
PLANES = {"workflows": "rollart.workflows", "activities": "rollart.activities",
          "workers": "rollart.workers"}
WORKFLOW_MAY_IMPORT = {"rollart.config", "rollart.contracts", "rollart.metrics", "rollart.queues",
                       "rollart.search_attributes", "rollart.workflows"}


def sources() -> dict[str, list[Path]]:
    """Source files by the package they install as: a plane, or "rollart" for the rest."""
    found = {name: sorted((ROOT / folder).rglob("*.py")) for folder, name in PLANES.items()}
    found["rollart"] = sorted((ROOT / "rollart").rglob("*.py"))
    return found


def rollart_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return {n for n in names if n == "rollart" or n.startswith("rollart.")}


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_planes_import_downward_only():
    wrong = []
    for package, paths in sources().items():
        for path in paths:
            for module in rollart_imports(path):
                if package == "rollart":
                    bad = any(within(module, p) for p in PLANES.values())
                elif package == "rollart.activities":
                    bad = within(module, "rollart.workflows") or within(module, "rollart.workers")
                elif package == "rollart.workflows":
                    bad = not any(within(module, p) for p in WORKFLOW_MAY_IMPORT)
                else:
                    bad = False
                if bad:
                    wrong.append(f"{path.relative_to(ROOT)} imports {module}")
    assert not wrong, "\n".join(wrong)


def test_contracts_import_no_logic():
    allowed = {"rollart.config", "rollart.queues"}
    assert rollart_imports(ROOT / "rollart" / "contracts.py") <= allowed


def defined_activities() -> set[str]:
    import rollart.activities as package

    names = set()
    for info in pkgutil.iter_modules(package.__path__, "rollart.activities."):
        module = importlib.import_module(info.name)
        for _, obj in inspect.getmembers(module):
            members = inspect.getmembers(obj) if inspect.isclass(obj) else [("", obj)]
            for _, fn in members:
                definition = getattr(fn, "__temporal_activity_definition", None)
                if definition is not None:
                    names.add(definition.name)
    return names


def test_every_activity_name_is_written_once():
    names = {v for k, v in vars(Activity).items() if k.isupper()}
    assert defined_activities() == names
    written = []
    for paths in sources().values():
        for path in paths:
            if path.name == "contracts.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and node.value in names:
                    written.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
    assert not written, "activity names written outside rollart.contracts:\n" + "\n".join(written)


def test_editable_install_maps_the_root_folders_into_rollart():
    import rollart.activities
    import rollart.workers
    import rollart.workflows

    assert Path(rollart.__file__).parent == ROOT / "rollart"
    for folder, name in PLANES.items():
        assert Path(sys.modules[name].__file__).parent == ROOT / folder
        assert folder not in sys.modules


def test_lint_refuses_bare_plane_imports(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import workflows\nfrom workers import cli\n")
    ruff = Path(sys.executable).parent / "ruff"
    done = subprocess.run([ruff, "check", "--no-cache", "--config", ROOT / "pyproject.toml",
                           bad], capture_output=True, text=True)
    assert done.returncode == 1
    assert done.stdout.count("TID251") == 2, done.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", out, ROOT], check=True)
    return next(out.glob("rollart-*.whl"))


def test_wheel_holds_only_the_rollart_package(wheel):
    files = zipfile.ZipFile(wheel).namelist()
    assert {f.split("/")[0] for f in files} == {"rollart", "rollart-0.1.0.dist-info"}
    for module in ("workflows/training.py", "activities/generate.py", "workers/cli.py",
                   "contracts.py", "policy/trainer.py"):
        assert f"rollart/{module}" in files


def test_wheel_installs_and_runs_outside_the_repository(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    python = venv / "bin" / "python"
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel],
                   check=True)
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # the dependencies come from this environment (its editable rollart is not loaded: only a
    # site directory's own .pth files run, and this one is a plain path)
    (Path(site) / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    work = tmp_path / "elsewhere"
    work.mkdir()
    (work / "my_envs.py").write_text(readme_block("python", "# my_envs.py"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}

    helped = subprocess.run([venv / "bin" / "rollart", "--help"], cwd=work, env=env,
                            capture_output=True, text=True)
    assert helped.returncode == 0, helped.stderr
    assert "rollart train" in helped.stdout

    probe = (
        "import importlib.util, sys, rollart.workflows.training, rollart.workers.cli\n"
        "from rollart.envs import load_plugins, registered_envs\n"
        "load_plugins(['my_envs'])\n"
        "print(rollart.workflows.training.__file__)\n"
        "print('guess_digit' in registered_envs())\n"
        "print([n for n in ('workflows', 'activities', 'workers')"
        " if importlib.util.find_spec(n)])\n")
    done = subprocess.run([python, "-c", probe], cwd=work, env=env, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    location, registered, top_level = done.stdout.splitlines()
    assert Path(location).is_relative_to(site)
    assert registered == "True"
    assert top_level == "[]"


def test_processes_that_do_not_train_or_generate_do_not_import_torch():
    """torch costs ~1.4 s of CPU to import: paid by the launcher before it starts the fleet (on
    every resume), and by each env, reward and control worker as the fleet starts."""
    modules = ["rollart.workers.cli", "rollart.workers.stack", "rollart.workers.progress",
               "rollart.workers.report", "rollart.workers.fleet", "rollart.activities.env",
               "rollart.activities.reward", "rollart.activities.route",
               "rollart.workflows.training", "rollart.workflows.trajectory", "rollart.weights"]
    probe = f"import sys, {', '.join(modules)}; print('torch' in sys.modules)"
    imported = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                              check=True, cwd=ROOT).stdout.strip()
    assert imported == "False"
