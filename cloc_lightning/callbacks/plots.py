"""Plots of a trained model: 2-D embedding of validation features and confusion matrices.

Both write a PNG into the run folder (``trainer.log_dir``) and the same image to
TensorBoard.  They run once (end of fit / end of test), so they cost one extra
pass over the validation (or test) set.
"""

from __future__ import annotations

import os
from typing import Any, Literal

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback

from cloc_lightning.callbacks._util import run_dir, tensorboard
from cloc_lightning.data_contract import datamodule_info
from cloc_lightning.plots import confusion_figure, embedding_figure, save_figure
from cloc_lightning.validation import check_choice

__all__ = ["EmbeddingPlot", "ConfusionMatrixPlot", "project_2d", "collect_outputs"]

#: how :class:`EmbeddingPlot` maps features to 2-D
Projection = Literal["pca", "tsne"]


def _write(trainer: L.Trainer, fig: Any, folder: str, filename: str, tag: str) -> str:
    path = os.path.join(folder, filename)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tb = tensorboard(trainer)
    if tb is not None:
        tb.add_figure(tag, fig, trainer.global_step, close=False)
    save_figure(fig, path)
    return path


@torch.no_grad()
def collect_outputs(
    pl_module: L.LightningModule, loader: Any, max_points: int = 3000, want_logits: bool = True
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """``(embeddings [N, D], logits [N, C] or None, labels [N])`` of up to ``max_points`` samples.

    Embeddings come from the module's ``embed`` hook (what its loss shapes) or
    ``extract_features``; logits from ``forward`` when the module classifies.
    """
    was_training = pl_module.training
    pl_module.eval()
    embed: Any = getattr(pl_module, "embed", None) or pl_module.extract_features
    feats, logits, labels, n = [], [], [], 0
    for x, y in loader:
        x = x.to(pl_module.device)
        feats.append(embed(x).float().cpu())
        if want_logits:
            out = pl_module(x)
            if isinstance(out, torch.Tensor) and out.ndim == 2:
                logits.append(out.float().cpu())
        labels.append(y.cpu())
        n += y.shape[0]
        if n >= max_points:
            break
    pl_module.train(was_training)
    lg = torch.cat(logits)[:max_points].numpy() if logits else None
    return torch.cat(feats)[:max_points].numpy(), lg, torch.cat(labels)[:max_points].numpy()


def project_2d(x: np.ndarray, method: Projection = "pca", seed: int = 0) -> np.ndarray:
    """``[N, D] -> [N, 2]`` by PCA or t-SNE (scikit-learn; t-SNE after a 50-d PCA)."""
    from sklearn.decomposition import PCA

    check_choice("method", method, Projection)
    if x.shape[1] <= 2:
        return np.pad(x, ((0, 0), (0, 2 - x.shape[1])))
    if method == "pca":
        flat: np.ndarray = PCA(n_components=2, random_state=seed).fit_transform(x)
        return flat
    from sklearn.manifold import TSNE

    if x.shape[1] > 50:
        x = PCA(n_components=50, random_state=seed).fit_transform(x)
    perplexity = min(30.0, max(5.0, len(x) / 10))
    mapped: np.ndarray = TSNE(n_components=2, init="pca", random_state=seed, perplexity=perplexity).fit_transform(x)
    return mapped


class EmbeddingPlot(Callback):
    """At the end of fit, a 2-D map of validation embeddings coloured by rank.

    For ordinal methods (CLOC, OrdinalCLIP) the classes should appear in order
    along a path.  Writes ``<log_dir>/embedding_<method>.png`` and TensorBoard
    image ``plots/embedding``.

    Args:
        method: ``pca`` (fast) or ``tsne``.
        max_points: validation samples used.
    """

    def __init__(self, method: Projection = "pca", max_points: int = 2000) -> None:
        self.method: Projection = check_choice("method", method, Projection)
        self.max_points = max_points
        self.path: str | None = None

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        folder = run_dir(trainer)  # every rank (a collective under DDP)
        data = datamodule_info(trainer, owner=type(self).__name__)
        if not trainer.is_global_zero or data is None:
            return
        # the whole split on rank 0 (under DDP val_dataloader gives each process its share only)
        feats, _, labels = collect_outputs(pl_module, data.whole_split_dataloader("val"), self.max_points, want_logits=False)
        names = data.class_names
        title = f"{type(pl_module).__name__}: validation embedding ({self.method.upper()})"
        fig = embedding_figure(project_2d(feats, self.method), labels, names, title)
        self.path = _write(trainer, fig, folder, f"embedding_{self.method}.png", "plots/embedding")


class ConfusionMatrixPlot(Callback):
    """Confusion matrix of the arg-max class, on the validation set at the end of fit
    and on the test set at the end of test (``confusion_val.png`` / ``confusion_test.png``)."""

    def __init__(self, max_points: int = 100_000) -> None:
        self.max_points = max_points
        self.paths: dict[str, str] = {}
        #: the last matrix drawn per stage (rows: true class, columns: predicted), on rank 0
        self.matrices: dict[str, np.ndarray] = {}

    def _plot(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        folder = run_dir(trainer)  # every rank (a collective under DDP)
        data = datamodule_info(trainer, owner=type(self).__name__)
        if not trainer.is_global_zero or data is None:
            return
        _, logits, labels = collect_outputs(pl_module, data.whole_split_dataloader(stage), self.max_points)  # type: ignore[arg-type]
        if logits is None:
            return
        n = logits.shape[1]
        cm = np.zeros((n, n), dtype=np.int64)
        np.add.at(cm, (labels, logits.argmax(1)), 1)
        self.matrices[stage] = cm
        names = data.class_names
        fig = confusion_figure(cm, names, f"{type(pl_module).__name__}: {stage} confusion")
        self.paths[stage] = _write(trainer, fig, folder, f"confusion_{stage}.png", f"plots/confusion_{stage}")

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._plot(trainer, pl_module, "val")

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._plot(trainer, pl_module, "test")
