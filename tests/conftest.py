"""Shared fixtures and helpers of the whole suite.

Paths to the real data, a tiny backbone, quiet torch threads, the quiet CPU trainer and the tiny
built-in data module the module tests train with, and the command line in a subprocess.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger

from cloc_lightning.data import OrdinalShapesDataModule

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("CLOC_SHARED_DATA", REPO.parent / "shared" / "data"))
UTKFACE = SHARED_DATA / "utkface"
CIFAR10 = SHARED_DATA / "cifar10"

#: a tiny timm model (0.4 M parameters) for fast module/CLI tests
TINY_BACKBONE = "test_resnet"

torch.set_num_threads(min(2, torch.get_num_threads()))


def needs(path: Path) -> pytest.MarkDecorator:
    """Skip (with the reason) when a real-data folder is absent."""
    return pytest.mark.skipif(
        not path.is_dir(), reason=f"real data not found at {path} (set CLOC_SHARED_DATA to the folder holding utkface/ and cifar10/)"
    )


def cli_env() -> dict[str, str]:
    """The environment of a subprocess run of this checkout: no warnings, 2 threads, the hub offline."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="2", HF_HUB_OFFLINE="1")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_cli(args: list[str], cwd: Path, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``python -m cloc_lightning <args>`` in a subprocess; fail with its output on error."""
    proc = subprocess.run(
        [sys.executable, "-m", "cloc_lightning", *args],
        cwd=cwd,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"cloc-lightning {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}")
    return proc


@pytest.fixture
def tiny_shapes_args() -> list[str]:
    """CLI arguments for a tiny built-in dataset run."""
    return [
        "--data",
        "OrdinalShapesDataModule",
        "--data.num_classes",
        "4",
        "--data.train_size",
        "64",
        "--data.val_size",
        "32",
        "--data.test_size",
        "32",
        "--data.batch_size",
        "16",
        "--data.num_workers",
        "0",
        "--trainer.max_epochs",
        "1",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.enable_model_summary",
        "false",
        "--trainer.logger.init_args.save_dir",
        "runs",
    ]


# ---------------------------------------------------------------------------------------------------
# in-process training: the trainer and the data the module tests share
# ---------------------------------------------------------------------------------------------------
#: the flags every in-process test trainer shares: one CPU process, nothing printed, no logger
QUIET_CPU: dict[str, Any] = dict(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False)


def cpu_trainer(root: Path | str | None = None, **flags: Any) -> L.Trainer:
    """A :data:`QUIET_CPU` trainer writing under ``root`` (Lightning's default folder when ``None``).

    ``flags`` add to or override the quiet ones; a test file binds its own defaults once, e.g.
    ``_trainer = functools.partial(cpu_trainer, max_epochs=1, limit_train_batches=2)``.
    """
    args: dict[str, Any] = dict(QUIET_CPU)
    if root is not None:
        args["default_root_dir"] = str(root)
    args.update(flags)
    return L.Trainer(**args)


def logged_trainer(root: Path | str, **flags: Any) -> L.Trainer:
    """:func:`cpu_trainer` with a TensorBoard logger under ``root/t`` that logs every step."""
    args: dict[str, Any] = dict(logger=TensorBoardLogger(str(root), name="t"), log_every_n_steps=1)
    args.update(flags)
    return cpu_trainer(None, **args)


def tiny_shapes(**kw: Any) -> OrdinalShapesDataModule:
    """The built-in ordinal shapes in the sizes of :func:`tiny_shapes_args`: 4 classes, 64/32/32 images,
    batches of 16, no loader workers (4 training steps per epoch); ``kw`` overrides any argument."""
    args: dict[str, Any] = dict(num_classes=4, train_size=64, val_size=32, test_size=32, batch_size=16, num_workers=0)
    args.update(kw)
    return OrdinalShapesDataModule(**args)


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """torch's intra-op threads set to ``n`` inside the block, restored after it."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One intra-op thread for the test: references of many tiny ops run up to 10x slower with a second
    OpenMP thread spin-waiting on a shared 2-core machine (``pytestmark = pytest.mark.usefixtures("one_thread")``)."""
    with torch_threads(1):
        yield


def linked_model_args(cfg: dict[str, Any]) -> dict[str, Any]:
    """A config's ``model.init_args`` as the command line passes them to the model: with the data module's ``num_classes``.

    The shipped configs name the classes once, on the data module; ``cloc-lightning`` links the data
    module's ``num_classes`` into a model whose ``num_classes`` is required (``cloc_lightning.cli``).
    The data module is built from the config (without ``train_views``: they do not change the classes).
    """
    import importlib

    from cloc_lightning.cli import _requires_num_classes

    args = dict(cfg["model"]["init_args"])
    model_module, _, model_name = cfg["model"]["class_path"].rpartition(".")
    if "num_classes" in args or not _requires_num_classes(getattr(importlib.import_module(model_module), model_name)):
        return args
    data_module, _, data_name = cfg["data"]["class_path"].rpartition(".")
    init = {k: v for k, v in (cfg["data"].get("init_args") or {}).items() if k != "train_views"}
    args["num_classes"] = getattr(importlib.import_module(data_module), data_name)(**init).num_classes
    return args


def cli_in_process(args: list[str], capsys: Any) -> tuple[int, str, str]:
    """``cloc-lightning <args>`` in this process: ``(exit code, stdout, stderr)`` (``capsys`` captures them)."""
    from cloc_lightning.cli import main

    code = 0
    try:
        main(args)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


# --------------------------------------------------------------------------------------------
# a time budget for CI's long tier (.ci/run): CI has a fixed wall-clock limit on a 2-core machine
# --------------------------------------------------------------------------------------------
#: seconds after the session's start at which no further test starts (0: no budget; .ci/run sets it for the long tier)
TEST_BUDGET_S = float(os.environ.get("CLOC_TEST_BUDGET_S", "0") or 0)
#: comma-separated path prefixes whose tests run first (.ci/run: the newest acceptance tests, so a budget cuts older ones)
TEST_FIRST = [p.strip() for p in os.environ.get("CLOC_TEST_FIRST", "").split(",") if p.strip()]
_SESSION_START = time.monotonic()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``CLOC_TEST_FIRST``: move the tests under those paths to the front (in the order given), the rest keep theirs."""
    if not TEST_FIRST:
        return

    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return next((i for i, prefix in enumerate(TEST_FIRST) if path.startswith(prefix)), len(TEST_FIRST))

    items.sort(key=rank)  # stable: the order within a group is pytest's


def pytest_runtest_setup(item: pytest.Item) -> None:
    """``CLOC_TEST_BUDGET_S``: a test not started within the budget is skipped, with the reason in the summary."""
    spent = time.monotonic() - _SESSION_START
    if TEST_BUDGET_S and spent > TEST_BUDGET_S:
        pytest.skip(
            f"not started: CI's time budget for this run (CLOC_TEST_BUDGET_S={TEST_BUDGET_S:.0f} s) was spent after "
            f"{spent:.0f} s; run it with pytest -m slow on a machine without the limit"
        )
