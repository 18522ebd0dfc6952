"""The oldest Lightning and jsonargparse that ``pyproject.toml`` accepts, tested: the CLI's tests run on them.

pip keeps an installed version that meets our lower bound, so a user whose cluster image
holds an older Lightning or jsonargparse runs exactly the floor we declare.  On 2026-11-29
the old floors (``lightning>=2.3``, ``jsonargparse>=4.27``) were false: Lightning 2.3 to 2.5.0
have no ``LightningCLI(parser_class=...)``, 2.5.6 fails to re-parse a checkpoint's
hyper-parameters after fit.  The current Lightning needs jsonargparse 4.39 to import; with 4.39
methods lost the defaults they re-declare (``SupConModule`` ran with Adam instead of SGD: a
silently different run), 4.46 kept them but its ``--model.help`` lacked the linked-argument
notes, and up to 4.50 a misspelt option or a broken YAML gave a multi-line union error instead of
our one line.  4.51 passes.

This test reads the two lower bounds from ``pyproject.toml``, installs exactly those versions
(``pip install --no-deps --target``) in front of the environment's own on ``PYTHONPATH``,
checks they are the ones imported, and runs the tests that exercise the parser: the method
arguments and help, the one-line errors, and one fit -> test -> predict through the CLI.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from tests.conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.packaging]
tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")

#: the dependencies whose lower bound is tested here (the name as pyproject.toml writes it, before any extra)
FLOORED = ("lightning", "jsonargparse")
#: the tests run on the floor: the parser's behaviour users see
SUITE = [
    "tests/methods/test_method_arguments.py",
    "tests/cli/test_method_help.py",
    "tests/cli/test_cli_errors.py",
    "tests/cli/test_cli.py::test_help_lists_registered_classes",
    "tests/cli/test_cli.py::test_fit_then_test_then_predict",
]


def declared_floors() -> dict[str, str]:
    """``{name: lower bound}`` of :data:`FLOORED` from ``[project] dependencies`` of pyproject.toml."""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    floors = {}
    for dep in deps:
        match = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?\s*(.*)", dep)
        assert match, f"pyproject.toml: cannot read the dependency {dep!r}"
        name, spec = match.groups()
        if name in FLOORED:
            lower = re.search(r">=\s*([0-9][0-9.]*)", spec)
            assert lower, f"pyproject.toml: {dep!r} has no `>=` lower bound"
            floors[name] = lower.group(1)
    assert sorted(floors) == sorted(FLOORED), f"pyproject.toml lacks {set(FLOORED) - set(floors)}"
    return floors


def test_declared_floors_are_read() -> None:
    floors = declared_floors()
    for name, version in floors.items():
        assert re.fullmatch(r"\d+(\.\d+)+", version), (name, version)


def test_cli_tests_pass_on_the_declared_floors(tmp_path: Path) -> None:
    floors = declared_floors()
    target = tmp_path / "floor"
    pins = [f"{name}=={version}" for name, version in floors.items()]
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--quiet", "--no-deps", "--target", str(target), *pins],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert install.returncode == 0, f"pip install {' '.join(pins)} failed:\n{install.stdout[-2000:]}\n{install.stderr[-3000:]}"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(target), str(REPO)]), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="2")
    env.pop("CLOC_TEST_BUDGET_S", None)  # the inner run is one test of the outer one: it is not cut by the outer budget

    probe = "import importlib.metadata as m, jsonargparse, lightning; print(lightning.__version__, jsonargparse.__version__)"
    seen = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert seen.returncode == 0, seen.stderr[-3000:]
    assert [Version(v) for v in seen.stdout.split()] == [Version(floors["lightning"]), Version(floors["jsonargparse"])], (
        f"imported lightning/jsonargparse {seen.stdout.strip()}, not the declared floors {floors}"
    )

    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning", *SUITE],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=1800,
    )
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
    failed = [line for line in run.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    assert run.returncode == 0, (
        f"on lightning {floors['lightning']} + jsonargparse {floors['jsonargparse']} (the floors pyproject.toml declares): {summary}\n"
        + "\n".join(failed[:30])
        + f"\nraise the bound in pyproject.toml or fix the code; full output:\n{run.stdout[-6000:]}\n{run.stderr[-2000:]}"
    )
    assert " passed" in summary and "skipped" not in summary, summary
