"""GPU tier fixtures: where the tables go, the data each config reads, and the switches.

Environment variables (all optional):

* ``CLOC_GPU_OUT`` -- the folder for the tables (``gpu_configs.{json,md}``, ``gpu_losses.{json,md}``);
  default: a fresh temporary folder, named at the end of the pytest run.
* ``CLOC_GPU_STEPS`` -- training steps per config and precision (default 50: two epochs of 25
  batches, so validation, checkpoints and the epoch boundary happen on the GPU too).
* ``CLOC_GPU_PRECISIONS`` -- comma-separated (default ``32-true,16-mixed,bf16-mixed``).
* ``CLOC_GPU_SYNC`` -- ``warn`` (default: record every host sync of the training step and fail
  after the run, listing them), ``error`` (stop at the first, with its traceback) or ``off``.
* ``CLOC_GPU_BUDGET`` -- seconds: once the session has run this long, the config cases not yet
  started are skipped (with that reason, and a row saying so) instead of started; default: none.
* ``CLOC_GPU_TRY_ON_CPU=1`` -- run the tier without CUDA, to check the harness itself: CPU,
  ``32-true`` only (CLOC_GPU_PRECISIONS may add ``bf16-mixed``), small batches and ``test_resnet``, no sync or memory
  measurement.  Not an acceptance run.
* ``CLOC_SHARED_DATA`` -- the folder holding ``utkface/`` and ``cifar10/`` (as for the rest of
  the suite); where a folder is absent, a generated stand-in in the same layout is used and the
  table says so.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.conftest import CIFAR10, UTKFACE

CUDA = torch.cuda.is_available()
TRY_ON_CPU = os.environ.get("CLOC_GPU_TRY_ON_CPU", "0") == "1"
NO_CUDA = (
    "the GPU tier needs a CUDA device (torch.cuda.is_available() is False here); run `pytest -m gpu` on a GPU "
    "machine, or .ci/gpu/run.sh on an offline GPU node (docs/gpu.md)"
)
#: the tier runs: CUDA present, or the harness check on CPU was asked for
ACTIVE = CUDA or TRY_ON_CPU
requires_gpu = pytest.mark.skipif(not ACTIVE, reason=NO_CUDA)

STEPS = int(os.environ.get("CLOC_GPU_STEPS", "4" if (TRY_ON_CPU and not CUDA) else "50"))
_PRECISIONS = "32-true" if (TRY_ON_CPU and not CUDA) else "32-true,16-mixed,bf16-mixed"
PRECISIONS = [p.strip() for p in os.environ.get("CLOC_GPU_PRECISIONS", _PRECISIONS).split(",") if p.strip()]
BUDGET = float(os.environ.get("CLOC_GPU_BUDGET", "0") or 0) or None
#: when this conftest was imported: the start of the session, for CLOC_GPU_BUDGET
SESSION_START = time.monotonic()
SYNC_MODE = os.environ.get("CLOC_GPU_SYNC", "warn")
if SYNC_MODE not in ("warn", "error", "off"):
    raise ValueError(f"CLOC_GPU_SYNC must be warn, error or off, got {SYNC_MODE!r}")


# --------------------------------------------------------------------------------------------
# the output folder and the tables
# --------------------------------------------------------------------------------------------
#: one id per pytest run, shared by pytest-xdist's workers (their rows go to the same tables)
RUN_ID = os.environ.get("PYTEST_XDIST_TESTRUNUID") or uuid.uuid4().hex
WORKER = os.environ.get("PYTEST_XDIST_WORKER")
_OUT: dict[str, Path] = {}


@pytest.fixture(scope="session")
def gpu_out() -> Path:
    """``$CLOC_GPU_OUT``, or a temporary folder for this run (its path is printed at the end of the run)."""
    if "path" not in _OUT:
        given = os.environ.get("CLOC_GPU_OUT")
        path = Path(given) if given else Path(tempfile.gettempdir()) / f"cloc-gpu-out-{RUN_ID[:12]}"
        path.mkdir(parents=True, exist_ok=True)
        _OUT["path"] = path
    return _OUT["path"]


def environment() -> dict[str, Any]:
    """What the numbers were measured on."""
    import lightning

    env: dict[str, Any] = {"torch": torch.__version__, "lightning": lightning.__version__, "cuda": torch.version.cuda}
    if CUDA:
        props = torch.cuda.get_device_properties(0)
        env.update(
            device=torch.cuda.get_device_name(0),
            memory_gib=round(props.total_memory / 2**30, 1),
            capability=".".join(map(str, torch.cuda.get_device_capability(0))),
        )
    else:
        env["device"] = "cpu (CLOC_GPU_TRY_ON_CPU=1: a harness check, not a measurement)"
    if WORKER:
        env["pytest-xdist workers"] = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "?")
    return env


class Table:
    """Rows of this pytest run, rewritten to ``<name>.json`` and ``<name>.md`` after every row (a run cut short
    still leaves the rows measured so far).  pytest-xdist's workers share the table: each row is appended,
    under a file lock, to ``<tmp>/cloc-gpu-rows-<run id>/<name>.jsonl`` (outside the output folder), and
    the tables are rebuilt from all rows, sorted by ``sort_key``."""

    def __init__(self, out: Path, name: str, title: str, columns: list[tuple[str, str]], notes: list[str], sort_key: Any = None) -> None:
        self.out, self.name, self.title, self.columns, self.notes, self.sort_key = out, name, title, columns, notes, sort_key
        rows_dir = Path(tempfile.gettempdir()) / f"cloc-gpu-rows-{RUN_ID[:12]}"
        rows_dir.mkdir(parents=True, exist_ok=True)
        self.rows_path = rows_dir / f"{name}.jsonl"

    def add(self, row: dict[str, Any]) -> None:
        with open(self.rows_path, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes
            f.write(json.dumps(row, default=str) + "\n")
            f.flush()
            f.seek(0)
            rows = [json.loads(line) for line in f if line.strip()]
            self.write(sorted(rows, key=self.sort_key) if self.sort_key else rows)

    @staticmethod
    def _cell(value: Any) -> str:
        if value is None:
            return "–"
        if isinstance(value, float):
            return (
                f"{value:.3g}"
                if abs(value) < 1e-2 and value != 0
                else f"{value:.1f}"
                if abs(value) >= 100
                else f"{value:.3f}".rstrip("0").rstrip(".")
            )
        return str(value).replace("|", "\\|").replace("\n", " ")

    def _replace(self, suffix: str, text: str) -> None:
        tmp = self.out / f".{self.name}{suffix}.{os.getpid()}"
        tmp.write_text(text)
        os.replace(tmp, self.out / f"{self.name}{suffix}")

    def write(self, rows: list[dict[str, Any]]) -> None:
        env = environment()
        self._replace(".json", json.dumps({"environment": env, "rows": rows}, indent=2, default=str))
        lines = [f"# {self.title}", "", "Environment: " + ", ".join(f"{k} {v}" for k, v in env.items()), ""]
        lines += [f"- {n}" for n in self.notes] + [""]
        lines.append("| " + " | ".join(title for _, title in self.columns) + " |")
        lines.append("|" + "---|" * len(self.columns))
        for row in rows:
            lines.append("| " + " | ".join(self._cell(row.get(key)) for key, _ in self.columns) + " |")
        self._replace(".md", "\n".join(lines) + "\n")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    path = _OUT.get("path") or os.environ.get("CLOC_GPU_OUT")
    if path and Path(path).is_dir() and any(Path(path).glob("gpu_*.md")):
        terminalreporter.write_line(f"GPU tier tables: {path}")


# --------------------------------------------------------------------------------------------
# data: the shared folders, or stand-ins in the same layout
# --------------------------------------------------------------------------------------------
def _jpegs(paths: list[Path], size: int, seed: int) -> None:
    from PIL import Image

    rng = np.random.default_rng(seed)
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)).save(path, quality=90)


@pytest.fixture(scope="session")
def cifar10_folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The CIFAR-10 JPEG folder (``train/<class>/``, ``test/<class>/``), or random 32 px JPEGs in that layout."""
    if CIFAR10.is_dir():
        return CIFAR10, f"shared ({CIFAR10})"
    root = tmp_path_factory.mktemp("cifar10_jpeg")
    for split, n in (("train", 400), ("test", 40)):
        _jpegs([root / split / f"c{c}" / f"{i:04d}.jpg" for c in range(10) for i in range(n)], 32, seed=len(split))
    return root, "generated (random JPEGs, CIFAR-10 layout)"


@pytest.fixture(scope="session")
def utkface_folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The UTKFace folder, or random 64 px JPEGs named as UTKFace's files (ages 1..90)."""
    if UTKFACE.is_dir():
        return UTKFACE, f"shared ({UTKFACE})"
    root = tmp_path_factory.mktemp("utkface")
    ages = np.random.default_rng(1).integers(1, 91, size=6000)
    _jpegs([root / f"{age}_{i % 2}_{i % 5}_2017{i:013d}.jpg.chip.jpg" for i, age in enumerate(ages)], 64, seed=2)
    return root, "generated (random JPEGs, UTKFace file names)"


@pytest.fixture(scope="session")
def torchvision_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Random images in torchvision's CIFAR-10 and STL-10 file layouts, enough for 25 full batches of the configs
    (1024 images for CIFAR-10, 256 for STL-10's unlabeled split) per epoch."""
    from tests.data.test_torchvision_data import _write_cifar10, _write_stl10

    root = tmp_path_factory.mktemp("torchvision")
    per_epoch = min(25, max(1, STEPS // 2))
    big = ACTIVE and CUDA
    _write_cifar10(root, n_per_batch=(1024 * per_epoch) // 5 + 1 if big else 64, n_test=2048 if big else 64)
    _write_stl10(root, n_train=512 if big else 32, n_test=512 if big else 32, n_unlabeled=256 * per_epoch if big else 64)
    return root


@pytest.fixture(scope="session")
def stage_one_folders() -> dict[str, Path]:
    """Run folders of the fits made in this session (``config -> folder``), read by the configs chained to them."""
    return {}


@pytest.fixture(scope="session")
def configs_table(gpu_out: Path) -> Table:
    """``gpu_configs.{json,md}``: one row per shipped config × precision."""
    order = {p: i for i, p in enumerate(["32-true", "16-mixed", "bf16-mixed"])}
    return Table(
        gpu_out,
        "gpu_configs",
        "Shipped configs on one device: memory, step time, host syncs",
        [
            ("config", "config"),
            ("precision", "precision"),
            ("status", "status"),
            ("data", "data"),
            ("batches", "batches"),
            ("checked_batches", "sync-checked batches"),
            ("n_syncs", "host syncs"),
            ("sync_sites", "sync sites"),
            ("scaler_steps_unchecked", "GradScaler steps (unchecked)"),
            ("peak_alloc_mib", "peak allocated (MiB)"),
            ("peak_reserved_mib", "peak reserved (MiB)"),
            ("start_alloc_mib", "allocated at fit start (MiB)"),
            ("ms_per_step", "ms/step (median)"),
            ("wall_s", "fit wall (s)"),
            ("overrides", "overrides beyond the common ones"),
        ],
        notes=[
            f"Each row: `cloc-lightning fit --config <config>` in this process (cloc_lightning.cli.main) on one device, "
            f"{STEPS} training batches in two epochs (`--trainer.limit_train_batches {max(1, STEPS // 2)} --trainer.max_steps {STEPS}`), "
            "2 validation batches per epoch, no sanity check, no test_after_fit, no progress bar.",
            "Host syncs: set_sync_debug_mode on every training batch that is not one of Lightning's logging steps "
            "(log_every_n_steps), from on_train_batch_start to on_train_batch_end (tests/gpu/_probe.py); "
            "GradScaler.step (16-mixed) runs unchecked: torch reads its inf flag with .item().",
            "Peak memory: torch.cuda.max_memory_allocated / max_memory_reserved over the fit (reset at on_fit_start). "
            "ms/step: median interval between CUDA events recorded after consecutive training batches of one epoch "
            "(data loading included), first 3 batches left out; with pytest-xdist workers sharing the device (see "
            "Environment) the step times are not those of a run alone (the throughput benchmark's are).",
        ],
        sort_key=lambda r: (r.get("config", ""), order.get(r.get("precision"), 9)),
    )


@pytest.fixture(scope="session")
def losses_table(gpu_out: Path) -> Table:
    """``gpu_losses.{json,md}``: each loss under autocast on the device against its float64 CPU reference."""
    return Table(
        gpu_out,
        "gpu_losses",
        "Losses under autocast on the device vs float64 references on the CPU",
        [
            ("loss", "loss"),
            ("dtype", "input / autocast dtype"),
            ("shape", "input"),
            ("reference", "reference"),
            ("value", "loss"),
            ("rel_err", "relative error of the loss"),
            ("grad_rel_err", "max gradient error / max |gradient|"),
            ("grad_tol", "gradient tolerance"),
        ],
        notes=[
            "Inputs drawn in float64, rounded to the autocast dtype, fed to the loss on the device under torch.autocast; the "
            "reference (tests/references/) gets the same rounded values in float64 on the CPU.",
            "The loss must equal the reference to 2e-5 (relative; the losses compute in float32 inside autocast); gradients "
            "w.r.t. the inputs come back in the input dtype and must match to a few units of its rounding.",
        ],
        sort_key=lambda r: (r.get("loss", ""), r.get("dtype", "")),
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The quick checks of the tier (sync probe, losses) first, the config runs last: a run cut short by
    ``CLOC_GPU_BUDGET`` or a timeout loses config rows, not the checks that prove the harness."""
    late = [i for i in items if i.path.name == "test_configs.py" and i.path.parent.name == "gpu"]
    if late:
        items[:] = [i for i in items if i not in late] + late


@pytest.fixture(scope="module")
def data(cifar10_folder: tuple[Path, str], utkface_folder: tuple[Path, str], torchvision_root: Path) -> dict[str, tuple[Path, str]]:
    """Every data source of the tier: ``{name: (root, where it came from)}`` (test_configs, test_device_path_gpu)."""
    return {
        "cifar10": cifar10_folder,
        "utkface": utkface_folder,
        "torchvision": (torchvision_root, "generated (random images, torchvision's file layout)"),
    }
