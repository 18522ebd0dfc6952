"""The package as users get it: ``python -m build``, then the wheel in a fresh venv, run from outside the repository.

``python -m build`` makes the sdist and then the wheel *from that sdist* (so a file missing
from the sdist is missing from the wheel).  The wheel must carry every ``cloc_lightning``
module and every YAML under ``configs/`` (as ``cloc_lightning/_configs``).  A fresh virtual
environment (``python -m venv``) gets ``pip install <wheel>`` with all its dependencies, and
from an empty temporary folder the installed ``cloc-lightning`` lists the configs, copies
``cloc/demo`` and trains it for a few steps -- also in the README's form
``--config configs/cloc/demo.yaml`` through the packaged-config fallback -- leaving its
TensorBoard logs and checkpoints.

The venv holds torch and the rest (about 6 GB; pip's cache keeps repeated installs at a
couple of minutes) and is deleted afterwards.  The tests skip only where ``build`` or
``venv`` + ``pip`` are not available; a failing build or install fails.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.packaging]

CONFIGS = sorted(p.relative_to(REPO / "configs").as_posix() for p in (REPO / "configs").rglob("*.y*ml"))
MODULES = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "cloc_lightning").rglob("*.py"))
#: a few training steps of the demo config, enough for validation, both checkpoints and test_after_fit
SHORT = [
    "--trainer.max_epochs",
    "1",
    "--trainer.limit_train_batches",
    "3",
    "--trainer.limit_val_batches",
    "2",
    "--trainer.limit_test_batches",
    "2",
    "--trainer.enable_progress_bar",
    "false",
    "--trainer.enable_model_summary",
    "false",
    "--data.init_args.num_workers",
    "0",
]


@dataclass
class Built:
    wheel: Path
    sdist: Path
    log: str


@dataclass
class Venv:
    root: Path
    python: Path
    cli: Path
    install_s: float


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a user's shell: no PYTHONPATH into the repository, no outer venv, quiet threads."""
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONDONTWRITEBYTECODE", "PYTHONWARNINGS")  # warnings stay visible
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(OMP_NUM_THREADS="2", HF_HUB_OFFLINE="1")
    env.update(extra or {})
    return env


def _run(cmd: list[str | Path], cwd: Path, timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` in its own process group (killed as a whole at ``timeout``); the result, whatever its exit code."""
    proc = subprocess.Popen(
        [str(c) for c in cmd], cwd=cwd, env=env or _env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"{' '.join(map(str, cmd))} did not finish in {timeout:.0f} s:\n{out[-3000:]}\n{err[-3000:]}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _ok(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, f"{' '.join(proc.args)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
    return proc


# ------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """``python -m build --outdir <tmp> <repo>``: the sdist, then the wheel built from it (isolated build env)."""
    if importlib.util.find_spec("build") is None:
        pytest.skip("the `build` package is not installed (it is in the test extra: pip install -e '.[test]')")
    out = tmp_path_factory.mktemp("dist")
    proc = _ok(_run([sys.executable, "-m", "build", "--outdir", out, REPO], cwd=REPO, timeout=900))
    wheels, sdists = sorted(out.glob("cloc_lightning-*.whl")), sorted(out.glob("cloc_lightning-*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in out.iterdir())
    assert not (REPO / "cloc_lightning" / "_configs").exists(), "the build left cloc_lightning/_configs in the source tree"
    return Built(wheels[0], sdists[0], proc.stdout + proc.stderr)


@pytest.fixture(scope="module")
def venv(built: Built) -> Iterator[Venv]:
    """A fresh venv with the wheel and its dependencies installed by pip; deleted afterwards (it holds ~6 GB)."""
    root = Path(tempfile.mkdtemp(prefix="cloc-wheel-venv-"))
    try:
        made = _run([sys.executable, "-m", "venv", root], cwd=root.parent, timeout=300)
        python = root / "bin" / "python"
        if made.returncode != 0 or not python.is_file():
            pytest.skip(f"cannot create a virtual environment with `{sys.executable} -m venv`: {made.stderr.strip()[-500:]}")
        if _run([python, "-m", "pip", "--version"], cwd=root, timeout=120).returncode != 0:
            pytest.skip("the new virtual environment has no pip (ensurepip is missing from this Python)")
        start = time.monotonic()
        _ok(_run([python, "-m", "pip", "install", "--disable-pip-version-check", built.wheel], cwd=root, timeout=1800))
        install_s = time.monotonic() - start
        print(f"\npip install of the wheel and its dependencies into a fresh venv: {install_s:.0f} s")
        yield Venv(root, python, root / "bin" / "cloc-lightning", install_s)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """An empty working folder outside the repository."""
    assert REPO not in tmp_path.resolve().parents, tmp_path
    return tmp_path


# ------------------------------------------------------------------ the artefacts
def test_wheel_holds_every_module_and_config(built: Built) -> None:
    names = set(zipfile.ZipFile(built.wheel).namelist())
    assert not [m for m in MODULES if m not in names], "modules missing from the wheel"
    packages = sorted(p.parent.relative_to(REPO).as_posix() for p in (REPO / "cloc_lightning").rglob("__init__.py"))
    assert len(packages) >= 6 and all(f"{p}/__init__.py" in names for p in packages), packages
    assert len(CONFIGS) >= 20
    assert not [c for c in CONFIGS if f"cloc_lightning/_configs/{c}" not in names], "configs missing from the wheel"
    assert not [n for n in names if n.startswith(("configs/", "tests/"))], "top-level folders leaked into the wheel"
    with zipfile.ZipFile(built.wheel) as whl:
        assert whl.read("cloc_lightning/_configs/cloc/demo.yaml") == (REPO / "configs" / "cloc" / "demo.yaml").read_bytes()
        entry_points = whl.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert "cloc-lightning = cloc_lightning.__main__:main" in entry_points


def test_sdist_carries_the_configs_and_the_build_hook(built: Built) -> None:
    with tarfile.open(built.sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"setup.py", "MANIFEST.in", "pyproject.toml", "README.md"} <= names
    assert not [c for c in CONFIGS if f"configs/{c}" not in names], "configs missing from the sdist"
    assert not [m for m in MODULES if m not in names], "modules missing from the sdist"


def test_build_prints_no_warnings(built: Built) -> None:
    """Setuptools' warnings (deprecated metadata, data folders treated as packages, manifest misses) are fixed, not ignored."""
    warnings = [line for line in built.log.splitlines() if re.search(r"warn|deprecat|^\s*!!\s*$", line, re.I)]
    assert not warnings, "python -m build printed warnings:\n" + "\n".join(warnings)


# ------------------------------------------------------------------ the installed wheel, outside the repository
def test_installed_package_is_the_wheel_not_the_repository(venv: Venv, outside: Path) -> None:
    code = (
        "import cloc_lightning, cloc_lightning.configs as c; "
        "print(cloc_lightning.__file__); print(c.configs_root()); print(len(c.list_configs()))"
    )
    file, root, count = _ok(_run([venv.python, "-c", code], cwd=outside, timeout=300)).stdout.split()
    assert Path(file).resolve().is_relative_to(venv.root.resolve()), file
    assert Path(root).resolve() == Path(file).resolve().parent / "_configs", root
    assert int(count) == len(CONFIGS)


def test_installed_command_lists_copies_and_trains_the_demo(venv: Venv, outside: Path) -> None:
    listed = _ok(_run([venv.cli, "configs", "list"], cwd=outside, timeout=300)).stdout
    assert sorted(line.split()[0] for line in listed.splitlines()) == sorted(c.rsplit(".", 1)[0] for c in CONFIGS)

    copied = _ok(_run([venv.cli, "configs", "copy", "cloc/demo"], cwd=outside, timeout=300))
    assert "copied cloc/demo to cloc_demo.yaml" in copied.stdout
    assert (outside / "cloc_demo.yaml").read_text() == (REPO / "configs" / "cloc" / "demo.yaml").read_text()

    fit = _ok(_run([venv.cli, "fit", "--config", "cloc_demo.yaml", *SHORT], cwd=outside, timeout=600))
    _check_run(fit, outside)


def test_readme_command_runs_from_the_wheel_anywhere(venv: Venv, outside: Path) -> None:
    """``cloc-lightning fit --config configs/cloc/demo.yaml`` without a configs/ folder: the packaged config is used."""
    fit = _ok(_run([venv.cli, "fit", "--config", "configs/cloc/demo.yaml", *SHORT], cwd=outside, timeout=600))
    assert "--config configs/cloc/demo.yaml: no such file here; using the packaged config cloc/demo" in fit.stderr
    assert str(venv.root) in fit.stderr  # the packaged file's path, inside the venv
    _check_run(fit, outside)


def _check_run(fit: subprocess.CompletedProcess[str], cwd: Path) -> None:
    """The demo run finished: test metrics printed, run folder with config, TensorBoard events and checkpoints."""
    assert "test/mae" in fit.stdout and "test/qwk" in fit.stdout, fit.stdout[-3000:]
    m = re.search(r"^logs \(TensorBoard\): (.+)$", fit.stdout, re.M)
    assert m, fit.stdout[-3000:]
    run = cwd / m.group(1).strip()
    assert run == cwd / "runs" / "cloc_demo" / "version_0", run
    assert (run / "config.yaml").is_file()
    assert list(run.glob("events.out.tfevents.*")), sorted(p.name for p in run.iterdir())
    ckpts = sorted(p.name for p in (run / "checkpoints").glob("*.ckpt"))
    assert any(n.startswith("best") for n in ckpts) and any(n.startswith("last") for n in ckpts), ckpts
