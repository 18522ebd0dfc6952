"""Validation and test under 2-process DDP (gloo) give the single-process metrics: every sample once.

Lightning's own ``DistributedSampler`` would repeat ``world_size - 1`` samples of an
evaluation set whose size the process count does not divide; the data modules shard
val/test without repeats (``cloc_lightning.data.eval_sharding``).  Here every module is
built with the same weights in two externally created processes (the ``torchrun`` path,
``strategy='ddp'``) and in the pytest process, and ``trainer.validate`` / ``trainer.test``
run on sets of 17 samples in batches of 8: the 2 ranks hold 9 and 8 samples (rank 1's as
7 + 1, so both run 2 steps, each with collectives).  Per-sample metrics (accuracy, MAE, QWK,
±1 accuracy, expected-rank MAE, the online probes') must equal the single-process ones,
and the ranks together must see each sample once; ``ConfusionMatrixPlot`` (rank 0 alone)
still counts the whole test split.  The contrastive methods' evaluation
losses depend on the batch (the contrast set is the global batch) and are not compared;
the cross-entropy losses of CE, CLOC and OrdinalCLIP are (``BaseModule.log_eval_mean``: a ``MeanMetric``
weighted by rows, exact when ranks hold different numbers of rows).

Marked ``slow`` and ``ddp``.
"""

from __future__ import annotations

import os
import traceback
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch

from cloc_lightning.callbacks import ConfusionMatrixPlot
from cloc_lightning.data import MultiCropViews, OrdinalShapesDataModule, SupConViews
from cloc_lightning.methods import CEModule, CLOCModule, SupConModule
from tests._ddp import run_distributed
from tests.conftest import TINY_BACKBONE

pytestmark = [pytest.mark.slow, pytest.mark.ddp]

CLASSES = 4
EVAL_SIZE = 17  # not a multiple of 2: Lightning's sampler would evaluate one sample twice
EVAL_BATCH = 8
#: per method, the keys that depend on which samples share a batch (contrast sets), not on each sample alone;
#: CE's, CLOC's and OrdinalCLIP's ``val/loss`` / ``test/loss`` are per-sample cross-entropy means and are compared
BATCH_DEPENDENT = {
    "supcon": ("val/loss", "test/loss"),
    "relic": ("val/loss", "test/loss", "val/invariance", "test/invariance"),
}


def _shapes(views: Any = None) -> OrdinalShapesDataModule:
    return OrdinalShapesDataModule(
        num_classes=CLASSES,
        train_size=16,
        val_size=EVAL_SIZE,
        test_size=EVAL_SIZE,
        batch_size=8,
        eval_batch_size=EVAL_BATCH,
        num_workers=0,
        train_views=views,
    )


def _build(name: str) -> tuple[L.LightningModule, L.LightningDataModule]:
    torch.manual_seed(0)
    if name == "ce":
        return CEModule(num_classes=CLASSES, backbone=TINY_BACKBONE), _shapes()
    if name == "cloc":
        return CLOCModule(num_classes=CLASSES, backbone=TINY_BACKBONE), _shapes()
    if name == "supcon":
        model = SupConModule(backbone=TINY_BACKBONE, projector_dim=16, num_classes=CLASSES, task="ordinal")
        return model, _shapes(SupConViews(n_views=2))
    if name == "relic":
        from cloc_lightning.methods.relic import ReLICModule

        model = ReLICModule(backbone=TINY_BACKBONE, projector_hidden_dim=32, projector_dim=16, num_classes=CLASSES, task="ordinal")
        return model, _shapes(MultiCropViews(num_global_views=2, num_local_views=0))
    if name == "ordinal_clip":
        from cloc_lightning.methods import OrdinalCLIPModule
        from tests.e2e.test_ddp_fit import CLIP_IMG, TINY_CLIP

        model = OrdinalCLIPModule(num_classes=CLASSES, clip_model="ViT-S-32-alt", clip_config=TINY_CLIP, num_context_tokens=4)
        return model, OrdinalShapesDataModule(
            num_classes=CLASSES,
            train_size=16,
            val_size=EVAL_SIZE,
            test_size=EVAL_SIZE,
            batch_size=8,
            eval_batch_size=EVAL_BATCH,
            num_workers=0,
            image_size=CLIP_IMG,
        )
    raise KeyError(name)


def _has_open_clip() -> bool:
    try:
        import open_clip  # noqa: F401
    except ImportError:
        return False
    return True


NAMES = ["ce", "cloc", "supcon", "relic"] + (["ordinal_clip"] if _has_open_clip() else [])


class SampleCounter(L.Callback):
    """Counts the labelled rows each rank evaluates."""

    def __init__(self) -> None:
        self.rows: dict[str, int] = {"val": 0, "test": 0}

    def on_validation_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self.rows["val"] += int(batch[1].shape[0])

    def on_test_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self.rows["test"] += int(batch[1].shape[0])


def _evaluate(name: str, devices: int, strategy: str, root: Path) -> dict[str, Any]:
    model, dm = _build(name)
    counter = SampleCounter()
    plot = ConfusionMatrixPlot()  # runs on rank 0 alone, on the whole test split
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy=strategy,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(root),
        callbacks=[counter, plot],
    )
    val = trainer.validate(model, datamodule=dm, verbose=False)[0]
    test = trainer.test(model, datamodule=dm, verbose=False)[0]
    plotted = int(plot.matrices["test"].sum()) if "test" in plot.matrices else None
    return {"metrics": {**val, **test}, "rows": dict(counter.rows), "plotted": plotted}


def _evaluate_every_method(rank: int, world_size: int, work: str) -> dict[str, Any]:
    os.environ.update({"LOCAL_RANK": str(rank), "RANK": str(rank), "NODE_RANK": "0", "WORLD_SIZE": str(world_size)})
    out: dict[str, Any] = {}
    for name in NAMES:
        try:
            out[name] = _evaluate(name, 2, "ddp", Path(work) / name)
        except Exception:  # noqa: BLE001 - reported by the method's test
            out[name] = {"error": traceback.format_exc()}
        torch.distributed.barrier()
    return out


@pytest.fixture(scope="module")
def ddp_results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_distributed(_evaluate_every_method, 2, str(tmp_path_factory.mktemp("ddp_eval")))


@pytest.mark.parametrize("name", NAMES)
def test_ddp_validate_and_test_equal_one_process(ddp_results: list[dict[str, Any]], name: str, tmp_path: Path) -> None:
    ranks = [r[name] for r in ddp_results]
    for r, result in enumerate(ranks):
        assert "error" not in result, f"rank {r} failed:\n{result.get('error')}"
    single = _evaluate(name, 1, "auto", tmp_path)
    assert single["rows"] == {"val": EVAL_SIZE, "test": EVAL_SIZE}
    compared = sorted(k for k in single["metrics"] if k not in BATCH_DEPENDENT.get(name, ()))
    assert any(k.endswith(("/acc", "/mae")) for k in compared), compared
    assert name not in ("ce", "cloc", "ordinal_clip") or {"val/loss", "test/loss"} <= set(compared)
    for result in ranks:
        assert sorted(result["metrics"]) == sorted(single["metrics"])
        got, want = (torch.tensor([float(m[k]) for k in compared], dtype=torch.float64) for m in (result["metrics"], single["metrics"]))
        differ = {
            k: (float(a), float(b)) for k, a, b in zip(compared, got, want, strict=True) if not torch.isclose(a, b, rtol=1e-5, atol=1e-6)
        }
        assert not differ, f"DDP vs one process: {differ}"
    # the confusion matrix (rank 0, classifying modules) counts the whole test split, not rank 0's share
    if single["plotted"] is not None:
        assert single["plotted"] == EVAL_SIZE and [r["plotted"] for r in ranks] == [EVAL_SIZE, None]
    assert name not in ("ce", "cloc", "ordinal_clip") or single["plotted"] == EVAL_SIZE
    # each sample once: 9 + 8 rows per split
    assert sorted(r["rows"]["val"] for r in ranks) == [8, 9] and sorted(r["rows"]["test"] for r in ranks) == [8, 9]
