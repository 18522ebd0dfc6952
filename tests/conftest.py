"""Shared fixtures: paths to the real data, a tiny backbone, quiet torch threads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

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


def run_cli(args: list[str], cwd: Path, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``python -m cloc_lightning <args>`` in a subprocess; fail with its output on error."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="2", HF_HUB_OFFLINE="1")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-m", "cloc_lightning", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"cloc-lightning {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}")
    return proc


@pytest.fixture
def tiny_shapes_args() -> list[str]:
    """CLI arguments for a tiny built-in dataset run."""
    return [
        "--data", "OrdinalShapesDataModule",
        "--data.num_classes", "4",
        "--data.train_size", "64",
        "--data.val_size", "32",
        "--data.test_size", "32",
        "--data.batch_size", "16",
        "--data.num_workers", "0",
        "--trainer.max_epochs", "1",
        "--trainer.enable_progress_bar", "false",
        "--trainer.enable_model_summary", "false",
        "--trainer.logger.init_args.save_dir", "runs",
    ]


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
