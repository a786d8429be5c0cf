"""The project's top-level packages are its own: no installed distribution ships a module of the same name.

Our C++ ops once lived in a top-level `kernels`, the name of Hugging Face's package that transformers (5.25+) imports
from `transformers.integrations.hub_kernels`; ours shadowed it and every model import failed. These tests read the
shipped packages from pyproject.toml, so a new top-level package is checked the day it is added.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OURS = "structured-speculation"


def shipped_top_levels() -> set[str]:
    """The top-level packages pyproject.toml ships, plus experiments/ (importable from a checkout)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = config["tool"]["setuptools"]["packages"]
    return {name.split(".")[0] for name in packages} | {"experiments"}


def collisions(names: set[str]) -> dict[str, list[str]]:
    """name -> the other installed distributions that provide a top-level module `name`."""
    providers = importlib.metadata.packages_distributions()
    found = {name: sorted(set(providers.get(name, ())) - {OURS}) for name in names}
    return {name: dists for name, dists in found.items() if dists}


def test_no_installed_distribution_provides_a_top_level_name_we_ship():
    assert shipped_top_levels() >= {"structspec_ops", "fsm", "drafting", "assisted"}
    assert collisions(shipped_top_levels()) == {}


def test_the_check_sees_a_collision_where_there_is_one():
    """Control: the name of our old ops package is Hugging Face's `kernels`, which transformers installs."""
    if "kernels" not in importlib.metadata.packages_distributions():
        pytest.skip("Hugging Face's `kernels` is not installed here")
    assert collisions({"kernels"}) == {"kernels": ["kernels"]}


def test_transformers_models_import_after_ours_from_a_checkout():
    """Run from the repository root (the checkout first on sys.path), as the README's commands do."""
    code = ("import assisted, structspec_ops, transformers.modeling_utils, importlib.util;"
            "spec = importlib.util.find_spec('kernels');"
            "print(spec.origin if spec else 'absent')")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    origin = run.stdout.strip().splitlines()[-1]
    if "kernels" in importlib.metadata.packages_distributions():  # Hugging Face's, as transformers 5.25+ installs
        theirs = importlib.metadata.distribution("kernels").locate_file("kernels/__init__.py")
        assert Path(origin).resolve() == Path(theirs).resolve()
    else:
        assert origin == "absent", origin
