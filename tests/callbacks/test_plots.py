"""Embedding and confusion-matrix plots: files, TensorBoard images, the numbers behind them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from lightning.pytorch.loggers import TensorBoardLogger

from cloc_lightning.callbacks import ConfusionMatrixPlot, EmbeddingPlot
from cloc_lightning.callbacks.plots import collect_outputs, project_2d
from cloc_lightning.data import OrdinalShapesDataModule
from cloc_lightning.methods import CLOCModule
from tests.conftest import TINY_BACKBONE, cpu_trainer


def test_project_2d_pca_recovers_the_main_axis() -> None:
    rng = np.random.default_rng(0)
    t = rng.normal(size=200)
    x = np.stack([t * 10, rng.normal(size=200) * 0.1, rng.normal(size=200) * 0.1], 1)
    p = project_2d(x, "pca")
    assert p.shape == (200, 2) and abs(np.corrcoef(p[:, 0], t)[0, 1]) > 0.99
    assert project_2d(x[:40], "tsne").shape == (40, 2)


def test_plots_written_after_fit_and_test(tmp_path: Path) -> None:
    dm = OrdinalShapesDataModule(num_classes=4, train_size=64, val_size=40, test_size=24, batch_size=16, num_workers=0)
    emb, conf = EmbeddingPlot("pca"), ConfusionMatrixPlot()
    trainer = cpu_trainer(max_epochs=1, logger=TensorBoardLogger(str(tmp_path), name="p"), callbacks=[emb, conf])
    model = CLOCModule(num_classes=4, backbone=TINY_BACKBONE)
    trainer.fit(model, datamodule=dm)
    trainer.test(model, datamodule=dm, verbose=False)
    assert Path(emb.path).name == "embedding_pca.png" and Path(emb.path).stat().st_size > 1000
    assert Path(conf.paths["val"]).is_file() and Path(conf.paths["test"]).is_file()
    feats, logits, labels = collect_outputs(model, dm.test_dataloader())
    assert feats.shape == (24, 4) and logits.shape == (24, 4)  # CLOC on logits: the embedding is the logits
    assert np.array_equal(labels, np.array(dm.test_set.targets))
    with torch.no_grad():
        model.eval()
        x, _ = next(iter(dm.test_dataloader()))
        assert np.allclose(logits[:16], model(x).numpy(), atol=1e-5)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    images = EventAccumulator(str(Path(trainer.log_dir))).Reload().Tags()["images"]
    assert {"plots/embedding", "plots/confusion_val", "plots/confusion_test"} <= set(images)
