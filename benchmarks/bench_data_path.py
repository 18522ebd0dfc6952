"""The data path inside a real ``Trainer.fit``: the loader's time per item, the device stage's, and the step's.

Each shipped config runs through the real CLI (``cloc_lightning.cli.main``) in this process,
twice side by side: the loader path (``data.augment_on: loader``, torchvision per sample, files
decoded every time) and the GPU data path (``--data.cache memory --data.augment_on device``).
Both with no loader workers, one torch thread and the ``test_resnet`` backbone, so the clock
sees each part alone: :class:`DataPathClock` (a callback, added with ``--trainer.callbacks+=``)
times the gap between two batches (the loader: indexing, decoding, augmenting on the loader,
collating) and, inside it, the data module's ``on_after_batch_transfer`` (the device stage, run
on the CPU here), and checks what the step receives (shapes, float dtype, every row and every
view different).

Then loader cores per 1,000 images/s: the SimCLR UTKFace pipeline at 32, 64, 128 and 224 px
on both paths (cores = 1,000 x the loader's seconds per item, one core per worker).

``python -m benchmarks --only data_path`` (results/data_path.{md,json}); needs
``../shared/data`` (UTKFace and the CIFAR-10 JPEGs).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch

REPO = Path(__file__).resolve().parent.parent
#: the issue's three self-supervised configs first (its goals are stated for them), then the supervised ones on UTKFace
CONFIGS = (
    "configs/simclr/utkface.yaml",
    "configs/relic/cifar10_cpu.yaml",
    "configs/supcon/cifar10_cpu.yaml",
    "configs/ce/utkface.yaml",
    "configs/cloc/utkface.yaml",
    "configs/corn/utkface.yaml",
)
DEVICE_PATH = ["--data.cache", "memory", "--data.augment_on", "device"]
_OUT_ENV = "CLOC_BENCH_DATA_PATH_OUT"
#: ``cpu`` here; the GPU script (``.ci/gpu/run.sh``) sets ``CLOC_BENCH_ACCELERATOR=gpu`` and ``CLOC_BENCH_BACKBONE=resnet18``
ACCELERATOR = os.environ.get("CLOC_BENCH_ACCELERATOR", "cpu")
BACKBONE = os.environ.get("CLOC_BENCH_BACKBONE", "test_resnet")


class DataPathClock(L.Callback):
    """Times the loader and the device stage of every training batch; writes them to ``$CLOC_BENCH_DATA_PATH_OUT``."""

    def __init__(self) -> None:
        self.gaps: list[float] = []
        self.device: list[float] = []
        self.steps: list[float] = []
        self.items: list[int] = []
        self.sizes: list[int] = []
        self.views: dict[str, Any] = {}
        self._end: float | None = None
        self._start: float | None = None
        self._stage = 0.0

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        dm = trainer.datamodule
        if dm is None or getattr(dm, "_clock_wrapped", False):
            return
        inner = dm.on_after_batch_transfer

        def timed(batch: Any, dataloader_idx: int) -> Any:
            t0 = time.perf_counter()
            out = inner(batch, dataloader_idx)
            if torch.cuda.is_available():
                torch.cuda.synchronize()  # the benchmark's clock only: the device stage is asynchronous on a GPU
            self._stage += time.perf_counter() - t0
            return out

        dm.on_after_batch_transfer = timed  # type: ignore[method-assign]
        dm._clock_wrapped = True  # type: ignore[attr-defined]

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        now = time.perf_counter()
        x = batch[0]
        views = x if isinstance(x, (list, tuple)) else [x]
        self.sizes.append(int(views[0].shape[0]))
        if self._end is not None:
            self.gaps.append(now - self._end - self._stage)
            self.device.append(self._stage)
            self.items.append(int(views[0].shape[0]))
            if not self.views:
                rows = torch.cat([v.flatten(1) for v in views if v.shape == views[0].shape])  # [V * B, pixels]
                distinct = torch.unique(rows, dim=0).shape[0]
                self.views = {
                    "shapes": [list(v.shape) for v in views],
                    "dtypes": sorted({str(v.dtype) for v in views}),
                    "rows_and_views": int(rows.shape[0]),
                    "distinct_rows_and_views": int(distinct),
                }
        self._stage = 0.0
        self._start = now

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self._end = time.perf_counter()
        if self._start is not None:
            self.steps.append(self._end - self._start)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        out = os.environ.get(_OUT_ENV)
        if not out:
            return
        Path(out).write_text(
            json.dumps(
                {
                    "gaps": self.gaps,
                    "device": self.device,
                    "steps": self.steps,
                    "items": self.items,
                    "sizes": self.sizes,
                    "views": self.views,
                }
            )
        )


def _per_item_ms(values: list[float], items: list[int], skip: int = 2) -> float:
    pairs = list(zip(values, items, strict=True))[skip:]
    return 1e3 * statistics.median(v / n for v, n in pairs)


def measure(config: str, extra: list[str], batches: int, root: Path) -> dict[str, Any]:
    """One in-process CLI fit of ``config``: the medians (ms per item) of the loader, the device stage and the step."""
    from cloc_lightning.cli import main

    out = root / f"clock-{abs(hash((config, tuple(extra))))}.json"
    os.environ[_OUT_ENV] = str(out)
    args = [
        "fit",
        "--config",
        str(REPO / config),
        "--model.backbone",
        BACKBONE,
        "--data.num_workers",
        "0",
        "--trainer.max_epochs",
        "1",
        "--trainer.limit_train_batches",
        str(batches),
        "--trainer.limit_val_batches",
        "0",
        "--trainer.num_sanity_val_steps",
        "0",
        "--trainer.logger",
        "false",
        "--trainer.enable_checkpointing",
        "false",
        "--trainer.accelerator",
        ACCELERATOR,
        "--trainer.devices",
        "1",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.callbacks+=benchmarks.bench_data_path.DataPathClock",
        "--trainer.default_root_dir",
        str(out.with_suffix("")),
        *extra,
    ]
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        main(args)
    except SystemExit as e:
        if e.code not in (0, None):
            raise RuntimeError(f"cloc-lightning {' '.join(args)} exited {e.code}") from e
    finally:
        os.chdir(cwd)
    rec = json.loads(out.read_text())
    return {
        "loader_ms_per_item": _per_item_ms(rec["gaps"], rec["items"]),
        "device_ms_per_item": _per_item_ms(rec["device"], rec["items"]),
        "step_ms_per_item": _per_item_ms(rec["steps"], rec["sizes"][: len(rec["steps"])]),
        "batches_timed": max(0, len(rec["gaps"]) - 2),
        "views": rec["views"],
    }


def run(quick: bool = False) -> tuple[str, dict[str, Any]]:
    """Measure every config on both paths, then the SimCLR pipeline at four sizes; return ``(markdown, data)``."""
    torch.set_num_threads(1)
    batches = 6 if quick else 16
    data: dict[str, Any] = {
        "configs": {},
        "sizes": {},
        "threads": 1,
        "batches": batches,
        "accelerator": ACCELERATOR,
        "backbone": BACKBONE,
        "date": time.strftime("%Y-%m-%d"),
        "loadavg_before": os.getloadavg()[0],
    }
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for config in CONFIGS:
            loader = measure(config, [], batches, root)
            device = measure(config, DEVICE_PATH, batches, root)
            data["configs"][config] = {"loader": loader, "device": device}
        sizes = (32, 64) if quick else (32, 64, 128, 224)
        for px in sizes:
            extra = ["--data.image_size", str(px), "--data.batch_size", "64"]
            data["sizes"][px] = {
                "loader": measure(CONFIGS[0], extra, max(4, batches // 2), root),
                "device": measure(CONFIGS[0], extra + DEVICE_PATH, max(4, batches // 2), root),
            }
    data["loadavg_after"] = os.getloadavg()[0]
    md = render(data)
    if not quick:
        from benchmarks.harness import write_results

        write_results("data_path", md, data, "python -m benchmarks --only data_path")
    return md, data


def render(data: dict[str, Any]) -> str:
    from benchmarks.harness import markdown_table

    rows = []
    for config, r in data["configs"].items():
        lo, de = r["loader"], r["device"]
        same = lo["views"]["shapes"] == de["views"]["shapes"] and lo["views"]["dtypes"] == de["views"]["dtypes"]
        distinct = de["views"]["distinct_rows_and_views"] == de["views"]["rows_and_views"]
        rows.append(
            [
                f"`{config}`",
                f"{lo['loader_ms_per_item']:.3f}",
                f"{de['loader_ms_per_item']:.3f}",
                f"{de['loader_ms_per_item'] / lo['loader_ms_per_item']:.3f}",
                f"{de['device_ms_per_item']:.3f}",
                f"{de['device_ms_per_item'] / lo['loader_ms_per_item']:.2f}",
                f"{lo['step_ms_per_item']:.3f}",
                "yes" if same else f"no: {lo['views']} vs {de['views']}",
                "yes" if distinct else "NO",
            ]
        )
    head = [
        "config",
        "loader path: loader ms/item",
        "device path: loader ms/item",
        "ratio (goal <= 0.1)",
        "device stage on the CPU, ms/item",
        "device stage / loader path (goal <= 1)",
        "step ms/item (test_resnet)",
        "same views (shapes, dtype)",
        "every row and view different",
    ]
    size_rows = []
    for px, r in data["sizes"].items():
        lo, de = r["loader"], r["device"]
        size_rows.append(
            [
                f"{px} px",
                f"{lo['loader_ms_per_item']:.3f}",
                f"{lo['loader_ms_per_item']:.2f}",
                f"{de['loader_ms_per_item']:.3f}",
                f"{de['loader_ms_per_item']:.3f}",
                f"{de['device_ms_per_item']:.3f}",
                f"{1000 / (lo['loader_ms_per_item'] + lo['step_ms_per_item']):.0f}",
                f"{1000 / (de['loader_ms_per_item'] + de['device_ms_per_item'] + de['step_ms_per_item']):.0f}",
            ]
        )
    size_head = [
        "SimCLR UTKFace views",
        "loader path: ms/item",
        "loader cores per 1,000 img/s",
        "device path: loader ms/item",
        "loader cores per 1,000 img/s",
        "device stage on the CPU, ms/item",
        "end to end on 1 CPU thread, loader path (img/s)",
        "end to end, device path (img/s)",
    ]
    return "\n".join(
        [
            "# The data path inside Trainer.fit",
            "",
            f"Measured {data['date']} with accelerator `{data['accelerator']}`, one torch thread, no loader workers, backbone `{data['backbone']}`, "
            f"{data['batches']} training batches per run (the first two not timed), medians per item; load average "
            f"{data['loadavg_before']:.1f} before, {data['loadavg_after']:.1f} after. Device path = "
            "`--data.cache memory --data.augment_on device` (on the CPU accelerator the device stage runs on the CPU).",
            "",
            markdown_table(head, rows),
            "",
            "Loader cores per 1,000 images/s = 1,000 x the loader's seconds per item (one worker per core); on the device "
            "path the views are made on the GPU, so the loader only indexes the store.",
            "",
            markdown_table(size_head, size_rows),
            "",
        ]
    )


if __name__ == "__main__":
    md, _ = run(quick=False)
    print(md)
