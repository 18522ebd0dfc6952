"""Frozen-encoder evaluation: load the encoder of any stage-one checkpoint, extract features, fit a linear probe.

Three layers, usable on their own:

* **Encoders from checkpoints** -- :func:`~cloc_lightning.checkpoints.load_encoder` /
  :func:`~cloc_lightning.checkpoints.encoder_state_dict` (:mod:`cloc_lightning.checkpoints`)
  find the evaluation encoder of a checkpoint of any of our pre-training modules
  (SupCon/SimCLR, Rank-N-Contrast, CE, CLOC, ReLIC, ...) and the timm architecture to rebuild it.
  Which weights form "the encoder" is a per-module decision (ReLIC evaluates the
  EMA target's encoder, not the online one), made by a small hook described below.
* **Features** -- :func:`extract_features` runs an encoder over a loader (eval mode,
  no gradients) and returns NumPy arrays; unlabelled rows (label < 0) are dropped.
* **The offline probe** -- :func:`logistic_regression_probe`: scikit-learn
  ``LogisticRegression`` on frozen features (:func:`knn_accuracy`: a weighted kNN
  classifier on the same features).  :func:`probe_checkpoint` chains all three
  for a checkpoint and a data module, and ``cloc-lightning probe``
  (:func:`cloc_lightning.cli.commands.probe_main`) is its command line.

Probe presets (:data:`PROBE_PRESETS`; ``preset=`` / ``--preset``; explicitly given
settings override the preset's):

* ``default``: ``LogisticRegression(C=1, max_iter=1000)`` on standardised
  (training-set mean/std), unnormalised features.
* ``sigmoid_cl``: the evaluation of the ReLIC-sigmoid seed (``scl/stl10_eval.py``):
  L2-normalised features, no standardisation, ``LogisticRegression(max_iter=100)``
  (C = 1) inside ``CalibratedClassifierCV`` (scikit-learn's defaults: 5-fold, sigmoid
  calibration, ensemble of the fold classifiers).

The encoder hook
----------------
For a checkpoint, the module class that wrote it is looked up (from the
``'cloc_lightning/encoder'`` entry that modules write in ``on_save_checkpoint`` via
:func:`~cloc_lightning.checkpoints.encoder_metadata`, or from the ``_class_path``
hyper-parameter LightningCLI stores).  Then, in order:

1. the class defines a classmethod ``encoder_state_dict(checkpoint) -> dict`` that
   returns the encoder's weights (keys as in the bare encoder, e.g. ``conv1.weight``);
2. else its ``encoder_prefix`` (class attribute, e.g. ``'target_encoder.'``, also
   recorded in the checkpoint entry) selects the keys;
3. else the default prefix ``'backbone.'`` (every :class:`BaseModule`).

A plain ``state_dict`` file (``torch.save(encoder.state_dict())``) works too, with
the architecture given explicitly (``backbone=...``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, get_args

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from cloc_lightning.checkpoints import build_encoder, load_encoder
from cloc_lightning.nn.online_probe import knn_predict
from cloc_lightning.validation import check_choice

__all__ = [
    "PROBE_PRESETS",
    "ProbeSplit",
    "ProbePreset",
    "probe_settings",
    "extract_features",
    "logistic_regression_probe",
    "knn_accuracy",
    "labelled_loader",
    "probe_checkpoint",
]

#: named probe protocols: the settings of :func:`logistic_regression_probe` / :func:`extract_features`
PROBE_PRESETS: dict[str, dict[str, Any]] = {
    "default": {"C": 1.0, "max_iter": 1000, "normalize": False, "standardize": True, "calibrated": False},
    # the ReLIC-sigmoid seed (scl/stl10_eval.py): CalibratedClassifierCV(LogisticRegression(max_iter=100))
    # on L2-normalised target-encoder features, no scaling
    "sigmoid_cl": {"C": 1.0, "max_iter": 100, "normalize": True, "standardize": False, "calibrated": True},
}

#: the split :func:`probe_checkpoint` scores
ProbeSplit = Literal["test", "val"]

#: the names of :data:`PROBE_PRESETS` (the ``--preset`` type of ``cloc-lightning probe``)
ProbePreset = Literal["default", "sigmoid_cl"]
assert set(get_args(ProbePreset)) == set(PROBE_PRESETS), "ProbePreset must name every PROBE_PRESETS entry"


def probe_settings(preset: str | None = None, **overrides: Any) -> dict[str, Any]:
    """The probe settings of ``preset`` (``None`` = ``'default'``) with the non-``None`` ``overrides`` applied.

    Keys: ``C``, ``max_iter``, ``normalize``, ``standardize``, ``calibrated``.
    """
    name = preset or "default"
    check_choice("probe preset", name, tuple(PROBE_PRESETS))
    unknown = set(overrides) - set(PROBE_PRESETS[name])
    if unknown:
        raise TypeError(f"unknown probe settings {sorted(unknown)}; known: {sorted(PROBE_PRESETS[name])}")
    settings = dict(PROBE_PRESETS[name])
    settings.update({k: v for k, v in overrides.items() if v is not None})
    return settings


# ------------------------------------------------------------------ features
@torch.no_grad()
def extract_features(
    encoder: nn.Module | Callable[[torch.Tensor], torch.Tensor],
    dataloader: DataLoader[Any] | Sequence[Any],
    device: str | torch.device = "cpu",
    normalize: bool = False,
    drop_unlabelled: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Features of every batch ``(images [B, 3, H, W], labels [B])`` of ``dataloader``.

    The encoder runs in eval mode without gradients (its training mode is restored).

    Args:
        encoder: maps images to ``[B, D]`` features.
        dataloader: single-view batches.
        device: where the encoder runs.
        normalize: L2-normalise the features (ReLIC evaluates normalised features).
        drop_unlabelled: drop rows with label ``< 0`` (STL-10's unlabeled split).

    Returns:
        ``(X float32 [N, D], y int64 [N])``.
    """
    was_training = getattr(encoder, "training", False)
    if isinstance(encoder, nn.Module):
        encoder.eval().to(device)
    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    try:
        for batch in dataloader:
            if not isinstance(batch, (list, tuple)) or len(batch) != 2:
                raise ValueError("extract_features expects batches (images, labels)")
            x, y = batch
            if isinstance(x, (list, tuple)):
                raise ValueError("extract_features needs single-view batches; use the data module's eval loaders")
            f = encoder(x.to(device)).float()
            if f.ndim != 2:
                raise ValueError(f"the encoder must return [B, D] features, got {tuple(f.shape)}")
            if normalize:
                f = torch.nn.functional.normalize(f, dim=1)
            y = torch.as_tensor(y)
            if drop_unlabelled:
                keep = y >= 0
                f, y = f[keep.to(f.device)], y[keep]
            xs.append(f.cpu().numpy())
            ys.append(y.cpu().numpy().astype(np.int64))
    finally:
        if isinstance(encoder, nn.Module) and was_training:
            encoder.train()
    if not xs:
        raise ValueError("the dataloader yielded no batches")
    return np.concatenate(xs), np.concatenate(ys)


def labelled_loader(loader: DataLoader[Any]) -> DataLoader[Any]:
    """``loader`` restricted to its labelled samples (for probes on STL-10 ``train+unlabeled``).

    Works on our data modules' loaders (a :class:`~cloc_lightning.data.datasets.TransformedSubset`
    dataset); other loaders are returned unchanged (:func:`extract_features` drops
    unlabelled rows anyway, after computing them).
    """
    from cloc_lightning.data.datasets import TransformedSubset

    ds = loader.dataset
    if not isinstance(ds, TransformedSubset):
        return loader
    keep = [i for i in ds.indices if ds.base.targets[i] >= 0]
    if len(keep) == len(ds.indices):
        return loader
    sub = TransformedSubset(ds.base, keep, ds.transform)
    return DataLoader(sub, batch_size=loader.batch_size, shuffle=False, num_workers=loader.num_workers, pin_memory=loader.pin_memory)


# -------------------------------------------------------------- the probe
def logistic_regression_probe(
    train_X: np.ndarray,
    train_y: np.ndarray,
    test_X: np.ndarray,
    test_y: np.ndarray,
    C: float = 1.0,
    max_iter: int = 1000,
    standardize: bool = True,
    calibrated: bool = False,
    seed: int = 0,
) -> dict[str, float]:
    """Fit scikit-learn ``LogisticRegression`` (multinomial, L-BFGS) on ``train_X`` and score ``test_X``.

    Args:
        train_X: [N, D] features; train_y: [N] labels; test_X: [M, D]; test_y: [M].
        C: inverse L2 regularisation strength.
        max_iter: L-BFGS iterations.
        standardize: zero-mean/unit-variance features (statistics of the training set).
        calibrated: wrap the classifier in ``CalibratedClassifierCV`` (as the seed's
            ``stl10_eval.py``; with ``standardize=False, max_iter=100`` it is the seed's probe).
        seed: random state.

    Returns:
        ``{'top1', 'top5' (>= 5 classes), 'train_top1', 'n_train', 'n_test', 'n_features'}``;
        accuracies are fractions in [0, 1].
    """
    from sklearn.calibration import CalibratedClassifierCV
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    train_X, test_X = np.asarray(train_X, dtype=np.float64), np.asarray(test_X, dtype=np.float64)
    train_y, test_y = np.asarray(train_y).astype(np.int64), np.asarray(test_y).astype(np.int64)
    if train_X.ndim != 2 or test_X.ndim != 2 or train_X.shape[1] != test_X.shape[1]:
        raise ValueError(f"features must be [N, D] and [M, D] with the same D, got {train_X.shape} and {test_X.shape}")
    if train_X.shape[0] != train_y.shape[0] or test_X.shape[0] != test_y.shape[0]:
        raise ValueError("features and labels differ in length")
    if len(np.unique(train_y)) < 2:
        raise ValueError("the training features hold fewer than 2 classes; a probe needs at least 2")
    if not (np.isfinite(train_X).all() and np.isfinite(test_X).all()):
        raise ValueError("features contain NaN or inf: the encoder has diverged (lower the lr / clip gradients)")
    if C <= 0 or max_iter < 1:
        raise ValueError(f"need C > 0 and max_iter >= 1, got C={C}, max_iter={max_iter}")
    clf: Any = LogisticRegression(C=C, max_iter=max_iter, random_state=seed)
    if calibrated:
        clf = CalibratedClassifierCV(clf)
    model = make_pipeline(StandardScaler(), clf) if standardize else clf
    import warnings

    from sklearn.exceptions import ConvergenceWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        model.fit(train_X, train_y)
    probs = model.predict_proba(test_X)
    classes = np.asarray(model.classes_)
    order = np.argsort(-probs, axis=1)
    result = {
        "top1": float((classes[order[:, 0]] == test_y).mean()),
        "train_top1": float((model.predict(train_X) == train_y).mean()),
        "n_train": float(train_X.shape[0]),
        "n_test": float(test_X.shape[0]),
        "n_features": float(train_X.shape[1]),
    }
    if len(classes) >= 5:
        result["top5"] = float((classes[order[:, :5]] == test_y[:, None]).any(axis=1).mean())
    return result


def knn_accuracy(
    train_features: torch.Tensor | np.ndarray,
    train_labels: torch.Tensor | np.ndarray,
    test_features: torch.Tensor | np.ndarray,
    test_labels: torch.Tensor | np.ndarray,
    k: int = 20,
    temperature: float = 0.07,
    num_classes: int | None = None,
) -> dict[str, float]:
    """Top-1 (and, for >= 5 classes, top-5) accuracy of a weighted kNN classifier on a test set.

    The kNN counterpart of :func:`logistic_regression_probe`, on the same inputs (the arrays
    of :func:`extract_features`, or tensors): each test row's ``k`` most cosine-similar
    training rows vote with weight ``exp(sim / temperature)``
    (:func:`~cloc_lightning.nn.online_probe.knn_predict`, which the online kNN monitor uses too).

    Shapes: ``train_features`` [N, D], ``train_labels`` [N], ``test_features`` [M, D],
    ``test_labels`` [M].  Returns ``{'top1': ..., 'top5': ...}`` as fractions in [0, 1].
    """
    train_features, train_labels = torch.as_tensor(train_features), torch.as_tensor(train_labels)
    test_features, test_labels = torch.as_tensor(test_features), torch.as_tensor(test_labels)
    c = num_classes or int(max(int(train_labels.max()), int(test_labels.max()))) + 1
    scores = knn_predict(train_features, train_labels, test_features, c, k, temperature)
    y = test_labels.to(scores.device).long()
    result = {"top1": float((scores.argmax(1) == y).float().mean())}
    if c >= 5:
        top5 = scores.topk(5, dim=1).indices
        result["top5"] = float((top5 == y[:, None]).any(dim=1).float().mean())
    return result


def probe_checkpoint(
    ckpt_path: str,
    datamodule: Any,
    device: str | torch.device = "cpu",
    C: float | None = None,
    max_iter: int | None = None,
    normalize: bool | None = None,
    standardize: bool | None = None,
    backbone: str | None = None,
    cifar_stem: bool | None = None,
    split: ProbeSplit = "test",
    calibrated: bool | None = None,
    preset: str | None = None,
) -> dict[str, Any]:
    """Offline linear probe of a checkpoint's encoder on a data module.

    Features of the (subsampled, labelled) training set with the *eval* transform
    (``datamodule.train_eval_dataloader()``) train :func:`logistic_regression_probe`;
    ``split`` (``test`` or ``val``) is scored.  ``C``, ``max_iter``, ``normalize``,
    ``standardize`` and ``calibrated`` left at ``None`` take the value of ``preset``
    (:data:`PROBE_PRESETS`; ``None`` = ``'default'``: C 1, 1000 iterations, standardised
    unnormalised features; ``'sigmoid_cl'``: the ReLIC-sigmoid seed's protocol).

    Returns:
        The probe's numbers plus ``'encoder'`` (where the weights came from), ``'backbone'``,
        ``'split'``, ``'preset'`` and ``'settings'`` (the resolved probe settings).
    """
    settings = probe_settings(preset, C=C, max_iter=max_iter, normalize=normalize, standardize=standardize, calibrated=calibrated)
    check_choice("split", split, ProbeSplit)
    enc = load_encoder(ckpt_path, backbone, cifar_stem)
    encoder, _ = build_encoder(enc)
    datamodule.setup("fit")
    datamodule.setup("test")
    train_loader = labelled_loader(datamodule.train_eval_dataloader())
    whole = getattr(datamodule, "whole_split_dataloader", None)  # loader-finished batches (also under data.augment_on: device)
    eval_loader = whole(split) if callable(whole) else (datamodule.test_dataloader() if split == "test" else datamodule.val_dataloader())
    train_X, train_y = extract_features(encoder, train_loader, device, settings["normalize"])
    test_X, test_y = extract_features(encoder, eval_loader, device, settings["normalize"])
    result: dict[str, Any] = logistic_regression_probe(
        train_X,
        train_y,
        test_X,
        test_y,
        C=settings["C"],
        max_iter=settings["max_iter"],
        standardize=settings["standardize"],
        calibrated=settings["calibrated"],
    )
    result.update({"encoder": enc.source, "backbone": enc.backbone, "split": split, "preset": preset or "default", "settings": settings})
    return result
