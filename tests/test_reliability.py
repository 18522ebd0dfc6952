"""Reliability: every bad input stops with a message naming the fix, and faults are survivable.

One test (or parametrised test) per row of the README table "input / fault -> what happens".

* Bad input: labels, ``num_classes``, ``learnable_map``, degenerate batches, NaN/inf, data
  roots, corrupt files, UTKFace names, model names, offline weights, config typos, view
  counts, ``encoder_ckpt``, phase-two margin files.
* Faults: a CLI fit SIGKILLed at several steps and resumed with ``--ckpt_path last`` ends
  bit-identical to an uninterrupted run (weights, CLOC margins, Adam state, schedule);
  checkpoints load with ``map_location`` and strictly; a stored checkpoint made by
  ``tests/fixtures/make_fixtures.py`` keeps loading and predicting the same outputs;
  bf16-mixed fits stay finite and the losses compute in float32; a dying loader worker or a
  file corrupted mid-epoch is a clear error, never a hang.

Degenerate-batch values are checked against independent NumPy loops of the papers' formulas.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import lightning as L
import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from PIL import Image

from cloc_lightning.callbacks import CLOCMarginFreeze
from cloc_lightning.data import (
    ImageFolderDataModule,
    MultiCropViews,
    OrdinalShapesDataModule,
    SupConViews,
    UTKFaceDataModule,
)
from cloc_lightning.data.base import DataConfigError
from cloc_lightning.data.folder import CSVDataModule
from cloc_lightning.data.transforms import ViewTransform
from cloc_lightning.losses import (
    OrdinalCLIPLoss,
    OrdinalContrastiveLoss_mm,
    OrdinalContrastiveLoss_sm,
    SigmoidContrastiveLoss,
    SupConLoss,
    sigmoid_contrastive_loss,
)
from cloc_lightning.methods import CEModule, CLOCModule, LinearProbeModule, OrdinalCLIPModule, ReLICModule, SupConModule
from tests.conftest import REPO, TINY_BACKBONE, run_cli

FIXTURES = Path(__file__).resolve().parent / "fixtures"
FIXTURE_CKPT = FIXTURES / "cloc_tiny.ckpt"
FIXTURE_OUTPUTS = FIXTURES / "cloc_tiny_outputs.pt"
#: a ~20k-parameter ResNet (the fixture's): fast fits and small checkpoints
SMALL = {"backbone": TINY_BACKBONE, "backbone_kwargs": {"channels": [8, 8, 16, 16], "stem_width": 4}}
TINY_CLIP = {
    "embed_dim": 24,
    "vision_cfg": {"layers": 1, "width": 32, "head_width": 16, "patch_size": 8, "image_size": 16},
    "text_cfg": {"context_length": 24, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
}


# =============================================================================================
# helpers and independent references
# =============================================================================================
def _shapes(
    num_classes: int = 4, views: int | ViewTransform | None = None, image_size: int = 32, **kw: Any
) -> OrdinalShapesDataModule:
    args: dict[str, Any] = dict(
        num_classes=num_classes, train_size=32, val_size=8, test_size=8, batch_size=8, num_workers=0,
        image_size=image_size, augment="none",
    )
    if views:
        args["train_views"] = SupConViews(n_views=views) if isinstance(views, int) else views
    args.update(kw)
    return OrdinalShapesDataModule(**args)


def _trainer(tmp_path: Path, **kw: Any) -> L.Trainer:
    args: dict[str, Any] = dict(
        max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False, default_root_dir=str(tmp_path),
        limit_train_batches=3, limit_val_batches=1, num_sanity_val_steps=0,
    )
    args.update(kw)
    return L.Trainer(**args)


def _fit(model: L.LightningModule, dm: L.LightningDataModule, tmp_path: Path, **kw: Any) -> L.Trainer:
    trainer = _trainer(tmp_path, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, datamodule=dm)
    return trainer


#: ReLIC, small: 2 global + 1 local view, a 32-16 projector, gamma schedule, no kNN monitor
RELIC_ARGS: dict[str, Any] = dict(
    num_global_views=2, num_local_views=1, projector_hidden_dim=32, projector_dim=16, use_gamma_scaling=True,
    gamma_scaling_steps=6, knn_k=0, lr=1e-3,
)


def _relic_views() -> MultiCropViews:
    # local crops of 24 px: 16 px crops reach layer4 as 1x1 maps, where PyTorch's CPU bf16 convolution backward
    # sporadically returns NaN gradients for the padding-only taps (see test_non_finite_gradients_...)
    return MultiCropViews(num_global_views=2, num_local_views=1, local_size=24)


#: every module, built small; ``views``: the data module's ``train_views``; ``size``: image size
MODULES: dict[str, tuple[Callable[..., L.LightningModule], Any, int]] = {
    "CEModule": (lambda n=4, **kw: CEModule(num_classes=n, **SMALL, **kw), None, 32),
    "CLOCModule": (lambda n=4, **kw: CLOCModule(num_classes=n, **SMALL, **kw), None, 32),
    "SupConModule-supcon": (
        lambda n=4, **kw: SupConModule(method="supcon", temperature=0.05, num_classes=n, task="ordinal", **SMALL, **kw), 2, 32
    ),
    "SupConModule-simclr": (
        lambda n=4, **kw: SupConModule(method="simclr", temperature=0.05, num_classes=n, task="ordinal", **SMALL, **kw), 2, 32
    ),
    "LinearProbeModule": (lambda n=4, **kw: LinearProbeModule(num_classes=n, encoder_ckpt=str(FIXTURE_CKPT), **kw), None, 32),
    "OrdinalCLIPModule": (
        lambda n=4, **kw: OrdinalCLIPModule(
            num_classes=n, clip_model="ViT-S-32-alt", clip_config=TINY_CLIP, num_context_tokens=4, **kw
        ),
        None,
        16,
    ),
    "ReLICModule": (lambda n=4, **kw: ReLICModule(num_classes=n, task="ordinal", **RELIC_ARGS, **SMALL, **kw), "relic", 32),
}


def _make(name: str, n: int = 4, **kw: Any) -> tuple[L.LightningModule, OrdinalShapesDataModule]:
    build, views, size = MODULES[name]
    torch.manual_seed(0)
    return build(n, **kw), _shapes(4, views=_relic_views() if views == "relic" else views, image_size=size)


def _softmax_lse(v: np.ndarray) -> float:
    m = float(np.max(v))
    return m + math.log(float(np.sum(np.exp(v - m))))


def supcon_reference(features: np.ndarray, labels: np.ndarray | None, t: float, base_t: float = 0.07) -> float:
    """SupCon ``L_out`` (Khosla et al. 2020, eq. 2) scaled by ``t / base_t`` as SupContrast's ``losses.py``
    (``base_temperature`` 0.07 there); SimCLR without labels; anchors without positives give 0."""
    b, v, _ = features.shape
    z = features.transpose(1, 0, 2).reshape(v * b, -1)
    ids = np.tile(labels if labels is not None else np.arange(b), v)
    losses = []
    for a in range(v * b):
        others = [k for k in range(v * b) if k != a]
        pos = [k for k in others if ids[k] == ids[a]]
        if not others or not pos:
            losses.append(0.0)
            continue
        lse = _softmax_lse(np.array([z[a] @ z[k] / t for k in others]))
        losses.append(t / base_t * float(np.mean([lse - z[a] @ z[p] / t for p in pos])))
    return float(np.mean(losses))


def cloc_reference(x: np.ndarray, y: np.ndarray, margins: np.ndarray) -> float:
    """CLOC (Pitawela et al. 2025), official reduction: ``sum_{j in P, k in N} relu(s_ik - s_ij + m) / (|P||N|^2)``."""
    xn = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-8)
    s = xn @ xn.T
    pos_of_class = np.concatenate([[0.0], np.cumsum(margins)])
    out = []
    for i in range(len(y)):
        P = [j for j in range(len(y)) if j != i and y[j] == y[i]]
        N = [k for k in range(len(y)) if y[k] != y[i]]
        total = sum(
            max(0.0, s[i, k] - s[i, j] + abs(pos_of_class[y[i]] - pos_of_class[y[k]])) for j in P for k in N
        )
        out.append(total / (len(P) * len(N) ** 2) if P and N else 0.0)
    return float(np.mean(out))


def ordinal_clip_reference(logits: np.ndarray, y: np.ndarray, sharpness: float = 10.0) -> float:
    """OrdinalCLIP (Li et al. 2022): CE over ranks + KL(q_r || p_r) over the batch per present rank."""
    n, r = logits.shape
    ce = float(np.mean([_softmax_lse(logits[i]) - logits[i, y[i]] for i in range(n)]))
    kls = []
    for rank in sorted(set(y.tolist())):
        target = sharpness * (y == rank).astype(np.float64)
        log_q = target - _softmax_lse(target)
        log_p = logits[:, rank] - _softmax_lse(logits[:, rank])
        kls.append(float(np.sum(np.exp(log_q) * (log_q - log_p))))
    return ce + float(np.mean(kls))


def sigmoid_reference(x: np.ndarray, xp: np.ndarray, tau: float, b: float, alpha: float, gamma: float,
                      max_tau: float = 5.0) -> float:
    """Basara's sigmoid contrastive loss (SigLIP + confidence penalty) + alpha * ReLIC's KL(T || P), as a loop."""
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    xpn = xp / np.linalg.norm(xp, axis=1, keepdims=True)
    logits = min(math.exp(tau), max_tau) * xn @ xpn.T + b
    n = len(x)
    loss_s = 0.0
    for i in range(n):
        for j in range(n):
            z = logits[i, j] if i == j else -logits[i, j]
            p = 1.0 / (1.0 + math.exp(-z))
            loss_s -= (1.0 - p) ** gamma * math.log(p)
    kl = 0.0
    for i in range(n):
        log_p = logits[i] - _softmax_lse(logits[i])  # row i over targets
        log_t = logits[:, i] - _softmax_lse(logits[:, i])  # column i over online rows
        kl += float(np.sum(np.exp(log_t) * (log_t - log_p)))
    return loss_s / n + alpha * kl / n


def _jpeg(path: Path, seed: int = 0, size: int = 20) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    arr = np.random.default_rng(seed).integers(0, 255, (size, size, 3), dtype=np.uint8)
    Image.fromarray(arr).save(path)


def _folder(root: Path, n: int = 6) -> Path:
    for split in ("train", "test"):
        for c in ("a", "b"):
            for i in range(n):
                _jpeg(root / split / c / f"{c}{i}.jpg", seed=i)
    return root


def _all_finite(module: torch.nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in module.parameters())


# =============================================================================================
# bad input
# =============================================================================================
LABEL_LOSSES: dict[str, Callable[[torch.Tensor, torch.Tensor], Any]] = {
    "cloc_mm": lambda x, y: OrdinalContrastiveLoss_mm(4)(x, y),
    "cloc_sm": lambda x, y: OrdinalContrastiveLoss_sm(4)(x, y),
    "supcon": lambda x, y: SupConLoss(0.1)(F.normalize(x, dim=-1).unsqueeze(1), y),
    "ordinal_clip": lambda x, y: OrdinalCLIPLoss()(x, y),
}


@pytest.mark.parametrize("loss", sorted(LABEL_LOSSES))
@pytest.mark.parametrize(
    "labels, error, match",
    [
        ([0, 1, 4, 2], ValueError, r"\[0, 4\)"),  # one past the last class
        ([0, -1, 2, 3], ValueError, r"\[0, 4\)"),  # negative
        ([0.0, 1.0, 2.0, 3.0], TypeError, r"\.long\(\)"),  # float labels
        ([True, False, True, True], TypeError, r"\.long\(\)"),  # bool labels
    ],
    ids=["too-large", "negative", "float", "bool"],
)
def test_labels_out_of_range_or_not_integer(loss: str, labels: list, error: type, match: str) -> None:
    x = torch.randn(4, 4)
    y = torch.tensor(labels)
    if loss == "supcon" and error is ValueError:
        # SupCon labels are class *ids* (any integers; the module maps unlabelled -1 to own ids): no range
        value = LABEL_LOSSES[loss](x, y)
        assert torch.isfinite(value)
        return
    with pytest.raises(error, match=match):
        LABEL_LOSSES[loss](x, y)


def test_data_labels_out_of_range_stop_at_setup(tmp_path: Path) -> None:
    """A CSV whose integer labels exceed class_names: stopped before training, with the range."""
    for i in range(6):
        _jpeg(tmp_path / f"{i}.jpg", seed=i)
    (tmp_path / "d.csv").write_text("path,label\n" + "\n".join(f"{i}.jpg,{i % 4}" for i in range(6)))
    with pytest.raises(DataConfigError, match=r"labels must lie in \[0, 3\)"):
        CSVDataModule(str(tmp_path / "d.csv"), class_names=["a", "b", "c"]).setup("fit")
    (tmp_path / "f.csv").write_text("path,label\n" + "\n".join(f"{i}.jpg,{i % 2}.5" for i in range(6)))
    with pytest.raises(DataConfigError, match="not in class_names"):  # non-integer labels need names
        CSVDataModule(str(tmp_path / "f.csv"), class_names=["0", "1"]).setup("fit")


@pytest.mark.parametrize(
    "name", ["CEModule", "CLOCModule", "SupConModule-supcon", "LinearProbeModule", "OrdinalCLIPModule", "ReLICModule"]
)
def test_num_classes_mismatching_the_data(name: str, tmp_path: Path) -> None:
    model, dm = _make(name, n=5)
    with pytest.raises(ValueError, match=r"num_classes=5 but OrdinalShapesDataModule has 4 classes.*num_classes 4"):
        _fit(model, dm, tmp_path)


@pytest.mark.parametrize(
    "margin_mode, learnable_map, error, match",
    [
        ("mm", [["fixed", 0.5], ["fixed", 0.6]], ValueError, "has 2 entries but .* needs exactly 3"),
        ("mm", [["fixed", 0.5]] * 4, ValueError, "has 4 entries but .* needs exactly 3"),
        ("sm", [["fixed", 0.5], ["fixed", 0.5]], ValueError, r"needs exactly 1"),
        ("mm", [["frozen", 0.5]] * 3, ValueError, "kind must be 'learnable' or 'fixed'"),
        ("mm", [["fixed", 0.0]] * 3, ValueError, "finite and > 0"),
        ("mm", [["learnable", -0.2]] * 3, ValueError, "finite and > 0"),
        ("mm", [["fixed", float("inf")]] * 3, ValueError, "finite and > 0"),
        ("mm", [["fixed", "0.4"]] * 3, TypeError, "quoted string in YAML"),
        ("mm", [["fixed", None]] * 3, ValueError, "'fixed' margin needs a value"),
        ("mm", ["fixed", "fixed", "fixed"], TypeError, r"must be a pair \[kind, value\]"),
        ("mm", [["fixed", 0.5, 1]] * 3, TypeError, r"must be a pair \[kind, value\]"),
        ("mm", 0.5, TypeError, "list of \\[kind, value\\] pairs"),
    ],
    ids=["short", "long", "sm-two", "kind", "zero", "negative", "inf", "yaml-string", "fixed-none", "not-pairs",
         "triples", "scalar"],
)
def test_malformed_learnable_map(margin_mode: str, learnable_map: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        CLOCModule(num_classes=4, margin_mode=margin_mode, learnable_map=learnable_map, **SMALL)


def _tiny_cli_config(model_args: dict[str, Any]) -> dict[str, Any]:
    """A CLOC config that finishes in seconds should it (wrongly) train."""
    return {
        "model": {"class_path": "cloc_lightning.methods.CLOCModule", "init_args": {"num_classes": 4, **SMALL, **model_args}},
        "data": {"class_path": "cloc_lightning.data.OrdinalShapesDataModule", "init_args": {
            "num_classes": 4, "train_size": 16, "val_size": 8, "test_size": 8, "batch_size": 8, "num_workers": 0}},
        "trainer": {"fast_dev_run": True, "logger": False, "enable_progress_bar": False},
    }


def test_learnable_map_wrong_type_from_yaml_through_the_cli(tmp_path: Path) -> None:
    """YAML strings: jsonargparse reads a quoted number ('0.4') as the number; anything else is refused by name."""
    cfg = _tiny_cli_config({"learnable_map": [["fixed", "0.4"], ["fixed", "abc"], ["fixed", 0.6]]})
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(cfg))
    proc = run_cli(["fit", "--config", "bad.yaml"], tmp_path, check=False, timeout=180)
    assert proc.returncode != 0
    assert "learnable_map[1]: the margin value must be a number > 0 or None, got 'abc'" in proc.stderr
    assert "learnable_map[0]" not in proc.stderr  # '0.4' became 0.4


# ---------------------------------------------------------------- degenerate batches
def _grad_check(loss: torch.Tensor, leaf: torch.Tensor) -> None:
    assert loss.dim() == 0 and bool(torch.isfinite(loss)), float(loss)
    loss.backward()
    assert leaf.grad is not None and bool(torch.isfinite(leaf.grad).all())


@pytest.mark.parametrize("mode", ["mm", "sm"])
@pytest.mark.parametrize("n", [1, 2, 6])
def test_cloc_batch_of_one_and_single_class(mode: str, n: int) -> None:
    torch.manual_seed(n)
    crit = OrdinalContrastiveLoss_mm(4) if mode == "mm" else OrdinalContrastiveLoss_sm(4)
    for y in (torch.zeros(n, dtype=torch.long), torch.full((n,), 3, dtype=torch.long)):
        x = torch.randn(n, 5, dtype=torch.float64, requires_grad=True)
        loss = crit(x, y)
        ref = cloc_reference(x.detach().numpy(), y.numpy(), crit.margins().detach().double().numpy())
        assert ref == 0.0 and float(loss.detach()) == 0.0  # no negatives (or no positives): nothing to separate
        _grad_check(loss, x)
    # two samples of two classes: each anchor has a negative but no positive -> 0 as well
    x = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)
    y = torch.tensor([0, 2])
    loss = crit(x, y)
    assert float(loss.detach()) == cloc_reference(x.detach().numpy(), y.numpy(), crit.margins().detach().double().numpy()) == 0.0
    _grad_check(loss, x)


@pytest.mark.parametrize("method", ["supcon", "simclr"])
@pytest.mark.parametrize("n, views", [(1, 1), (1, 2), (2, 1), (2, 2), (6, 2)])
def test_supcon_batch_of_one_and_single_class(method: str, n: int, views: int) -> None:
    torch.manual_seed(10 * n + views)
    f = F.normalize(torch.randn(n, views, 8, dtype=torch.float64), dim=-1).requires_grad_(True)
    labels = torch.zeros(n, dtype=torch.long) if method == "supcon" else None
    loss = SupConLoss(temperature=0.05)(f, labels)
    ref = supcon_reference(f.detach().numpy(), None if labels is None else labels.numpy(), 0.05)
    assert float(loss.detach()) == pytest.approx(ref, abs=1e-9)
    _grad_check(loss, f)


@pytest.mark.parametrize("n", [1, 2, 5])
def test_ordinal_clip_loss_batch_of_one_and_single_class(n: int) -> None:
    torch.manual_seed(n)
    logits = (torch.randn(n, 4, dtype=torch.float64) * 5).requires_grad_(True)
    y = torch.full((n,), 2, dtype=torch.long)
    loss = OrdinalCLIPLoss()(logits, y)
    assert float(loss.detach()) == pytest.approx(ordinal_clip_reference(logits.detach().numpy(), y.numpy()), rel=1e-6)
    _grad_check(loss, logits)


@pytest.mark.parametrize("case", ["one", "two-identical", "four-identical", "two"])
def test_sigmoid_loss_batch_of_one_and_identical_samples(case: str) -> None:
    """No labels here: a batch of one has only its positive; identical samples make every negative look positive."""
    torch.manual_seed(3)
    n = {"one": 1, "two-identical": 2, "four-identical": 4, "two": 2}[case]
    x = torch.randn(1 if "identical" in case else n, 8, dtype=torch.float64).expand(n, 8).clone().requires_grad_(True)
    xp = (x.detach() + 0.1 * torch.randn(n, 8, dtype=torch.float64)).requires_grad_(True)
    tau = torch.tensor(math.log(5.0), dtype=torch.float64, requires_grad=True)
    b = torch.tensor(-5.0, dtype=torch.float64, requires_grad=True)
    loss, kl = sigmoid_contrastive_loss(x, xp, tau, b, alpha=1.0, gamma=1.0)
    ref = sigmoid_reference(x.detach().numpy(), xp.detach().numpy(), math.log(5.0), -5.0, 1.0, 1.0)
    assert float(loss.detach()) == pytest.approx(ref, rel=1e-9)
    if n == 1:
        assert float(kl.detach()) == 0.0  # one row: both soft-maxes are 1
    _grad_check(loss, x)
    assert all(t.grad is not None and bool(torch.isfinite(t.grad).all()) for t in (xp, tau, b))


# ---------------------------------------------------------------- NaN / inf
NAN_LOSSES: dict[str, Callable[[torch.Tensor], Any]] = {
    "cloc_mm": lambda x: OrdinalContrastiveLoss_mm(4)(x, torch.tensor([0, 1, 2, 3])),
    "cloc_sm": lambda x: OrdinalContrastiveLoss_sm(4)(x, torch.tensor([0, 1, 2, 3])),
    "supcon": lambda x: SupConLoss(0.1)(x.unsqueeze(1), torch.tensor([0, 1, 2, 3])),
    "simclr": lambda x: SupConLoss(0.1)(torch.stack([x, x], 1)),
    "ordinal_clip": lambda x: OrdinalCLIPLoss()(x, torch.tensor([0, 1, 2, 3])),
}


@pytest.mark.parametrize("loss", sorted(NAN_LOSSES))
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"])
def test_non_finite_features_are_a_clear_error(loss: str, bad: float) -> None:
    x = torch.randn(4, 4)
    x[2, 1] = bad
    with pytest.raises(ValueError, match="NaN or inf|NaN/inf") as info:
        NAN_LOSSES[loss](x)
    assert "learning rate" in str(info.value)  # names the fix


@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_sigmoid_loss_propagates_non_finite_features(bad: float) -> None:
    """Documented behaviour: the sigmoid loss has no input check (its hot path); NaN/inf gives a NaN loss,
    which every module's ``check_finite_loss`` stops before the update (``test_nan_inputs_stop_every_module...``)."""
    x = torch.randn(4, 8)
    x[1, 2] = bad
    loss, terms = SigmoidContrastiveLoss(alpha=1.0, gamma=1.0).compute(x, torch.randn(4, 8))
    kl = terms["invariance"]
    assert bool(torch.isnan(loss)) and bool(torch.isnan(kl))


class _NaNShapes(OrdinalShapesDataModule):
    """Training images (every view) are NaN: what a diverged upstream or a broken decoder delivers."""

    def train_image_transform(self) -> Callable[[Any], Any]:
        base = super().train_image_transform()

        def poisoned(img: Any) -> Any:
            out = base(img)
            return [v * float("nan") for v in out] if isinstance(out, (list, tuple)) else out * float("nan")

        return poisoned


@pytest.mark.parametrize("name", sorted(MODULES))
def test_nan_inputs_stop_every_module_before_the_weights_change(name: str, tmp_path: Path) -> None:
    model, dm = _make(name)
    dm = _NaNShapes(num_classes=4, train_size=32, val_size=8, test_size=8, batch_size=8, num_workers=0,
                    image_size=dm.image_size, augment="none", train_views=dm.train_views)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    with pytest.raises((ValueError, FloatingPointError), match="NaN|not finite") as info:
        _fit(model, dm, tmp_path)
    assert "learning rate" in str(info.value)
    assert _all_finite(model)
    assert all(torch.equal(p.detach(), before[k]) for k, p in model.named_parameters())  # no NaN update


def test_non_finite_gradients_with_a_finite_loss_stop_before_the_step(tmp_path: Path) -> None:
    """A backward kernel that returns NaN (PyTorch 2.14's CPU bf16 convolution does so, sporadically, for 1x1
    feature maps) leaves the loss finite: the gradient check names the parameter and keeps the weights."""
    model, dm = _make("CEModule")
    model.head.weight.register_hook(lambda g: g * float("nan"))
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    with pytest.raises(FloatingPointError, match=r"non-finite gradients .*\['head.weight'\].*32-true"):
        _fit(model, dm, tmp_path)
    assert all(torch.equal(p.detach(), before[k]) for k, p in model.named_parameters())


def test_non_finite_loss_check_can_be_turned_off(tmp_path: Path) -> None:
    """``check_finite_loss: false`` lets a NaN loss through (documented escape hatch); default stops."""
    model, _ = _make("CEModule", check_finite_loss=False)
    dm = _NaNShapes(num_classes=4, train_size=32, val_size=8, test_size=8, batch_size=8, num_workers=0, augment="none")
    _fit(model, dm, tmp_path, limit_train_batches=1, limit_val_batches=0)
    assert not _all_finite(model)  # exactly what the default check prevents


# ---------------------------------------------------------------- data folders and files
def test_missing_or_empty_data_roots(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "noimages" / "a").mkdir(parents=True)
    (tmp_path / "noimages" / "a" / "notes.txt").write_text("x")
    cases = [
        (lambda: UTKFaceDataModule(str(tmp_path / "missing")), "does not exist"),
        (lambda: UTKFaceDataModule(str(tmp_path / "empty")), "contains no image files"),
        (lambda: ImageFolderDataModule(str(tmp_path / "missing")), "does not exist"),
        (lambda: ImageFolderDataModule(str(tmp_path / "empty")), "no class folders"),
        (lambda: ImageFolderDataModule(str(tmp_path / "noimages")), "no images under"),
        (lambda: CSVDataModule(str(tmp_path / "missing.csv")), "does not exist; set data.csv_path"),
    ]
    for make, match in cases:
        with pytest.raises(DataConfigError, match=match):
            make().setup("fit")


def test_corrupt_image_fails_with_the_name_by_default_and_skip_counts(tmp_path: Path) -> None:
    root = _folder(tmp_path / "data")
    bad = root / "train" / "a" / "a3.jpg"
    bad.write_bytes(b"\xff\xd8 truncated jpeg")
    dm = ImageFolderDataModule(str(root), val_fraction=0.0, batch_size=4, num_workers=0, augment="none")
    dm.setup("test")
    with pytest.raises(RuntimeError, match=r"Cannot read image '.*a3\.jpg'.*bad_files: skip"):
        list(dm.train_dataloader())
    dm = ImageFolderDataModule(str(root), val_fraction=0.0, batch_size=4, num_workers=0, augment="none", bad_files="skip")
    dm.setup("test")
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        n = sum(b[0].shape[0] for b in dm.train_dataloader())
    messages = [str(w.message) for w in rec if "skipping unreadable image" in str(w.message)]
    assert n == 12 and len(messages) == 1  # the next readable image takes the bad one's place
    assert "a3.jpg" in messages[0] and "1 skipped so far" in messages[0]
    assert dm.train_set.base.skipped == 1


def test_utkface_names_that_do_not_parse(tmp_path: Path) -> None:
    for i, age in enumerate([3, 20, 35, 50, 70, 9]):
        _jpeg(tmp_path / f"{age}_0_1_2017010{i}.jpg.chip.jpg", seed=i)
    _jpeg(tmp_path / "IMG_0001.jpg")
    _jpeg(tmp_path / "age_0_1.jpg")
    with pytest.raises(DataConfigError, match=r"2 file\(s\).*IMG_0001\.jpg.*strict_names: false"):
        UTKFaceDataModule(str(tmp_path)).setup("fit")
    dm = UTKFaceDataModule(str(tmp_path), strict_names=False, batch_size=1, drop_last=False, split_fractions=(1, 1, 1))
    with pytest.warns(UserWarning, match="skipped 2 UTKFace file"):
        dm._ensure_base()


# ---------------------------------------------------------------- models and configs
def test_unknown_timm_and_open_clip_model_names() -> None:
    from cloc_lightning.nn.backbones import create_backbone
    from cloc_lightning.nn.clip import load_clip

    with pytest.raises(ValueError, match=r"Unknown timm backbone 'resnet181'.*'resnet18'"):
        create_backbone("resnet181")
    with pytest.raises(ValueError, match=r"Unknown timm backbone 'resnet181'"):
        CLOCModule(num_classes=4, backbone="resnet181")
    with pytest.raises(ValueError, match=r"Unknown open_clip model name 'ViT-B-322'.*'ViT-B-32'"):
        load_clip("ViT-B-322", None)
    with pytest.raises(ValueError, match=r"Unknown open_clip model name 'ViT-B-322'"):
        OrdinalCLIPModule(num_classes=4, clip_model="ViT-B-322")


def test_pretrained_weights_unavailable_offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from huggingface_hub import constants

    from cloc_lightning.nn.clip import load_clip
    from cloc_lightning.nn.hub import PretrainedUnavailableError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))  # nothing cached
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    t0 = time.perf_counter()
    with pytest.raises(PretrainedUnavailableError, match="HF_HUB_OFFLINE.*pretrained: false"):
        CEModule(num_classes=4, backbone="resnet18", pretrained=True)
    with pytest.raises(PretrainedUnavailableError, match="HF_HUB_OFFLINE"):
        load_clip("RN50", "openai")
    assert time.perf_counter() - t0 < 20  # fails fast: no minute of hub retries


def test_config_typos_fail_naming_the_key(tmp_path: Path) -> None:
    """An unknown key in YAML, or on the command line, stops while parsing with the key named.

    (Command-line options may be abbreviated to a unique prefix, argparse's ``allow_abbrev``:
    ``--trainer.max_epoch`` *is* ``--trainer.max_epochs``; a key that is no prefix is refused.)
    """
    cfg = _tiny_cli_config({"margn_lr": 0.1})
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    proc = run_cli(["fit", "--config", "cfg.yaml"], tmp_path, check=False, timeout=180)
    assert proc.returncode != 0 and "margn_lr" in proc.stderr, proc.stderr[-2000:]
    (tmp_path / "good.yaml").write_text(yaml.safe_dump(_tiny_cli_config({"margin_lr": 0.1})))
    proc = run_cli(["fit", "--config", "good.yaml", "--trainer.max_epochz", "1"], tmp_path, check=False, timeout=180)
    assert proc.returncode != 0 and "max_epochz" in proc.stderr, proc.stderr[-2000:]
    assert "Epoch" not in proc.stdout + proc.stderr  # stopped while parsing, before any training


def test_multi_view_counts_that_do_not_match_the_module(tmp_path: Path) -> None:
    model = SupConModule(n_views=2, num_classes=4, task="ordinal", **SMALL)
    with pytest.raises(ValueError, match=r"n_views=2\) got 3 view\(s\).*n_views: 2"):
        _fit(model, _shapes(views=3), tmp_path)
    with pytest.raises(ValueError, match="needs multi-view batches; set data.train_views"):
        _fit(SupConModule(num_classes=4, task="ordinal", **SMALL), _shapes(), tmp_path)
    with pytest.raises(ValueError, match="single-view batches but the data module yields 2 views"):
        _fit(CLOCModule(num_classes=4, **SMALL), _shapes(views=2), tmp_path)
    with pytest.raises(ValueError, match="simclr needs n_views >= 2"):
        SupConModule(method="simclr", n_views=1)
    relic = ReLICModule(num_classes=4, task="ordinal", **RELIC_ARGS, **SMALL)
    with pytest.raises(ValueError, match=r"num_global_views=2, num_local_views=1\) but the data module yields 2 views"):
        _fit(relic, _shapes(views=MultiCropViews(num_global_views=2, num_local_views=0)), tmp_path)
    with pytest.raises(ValueError, match="needs multi-crop batches"):
        _fit(relic, _shapes(), tmp_path)


def test_relic_mini_batch_size_not_dividing_the_batch(tmp_path: Path) -> None:
    relic = ReLICModule(num_classes=4, task="ordinal", mini_batch_size=3, **RELIC_ARGS, **SMALL)
    with pytest.raises(ValueError, match=r"mini_batch_size=3 does not divide data.batch_size=8.*e\.g\. 2"):
        _fit(relic, _shapes(views=_relic_views()), tmp_path)
    relic = ReLICModule(num_classes=4, task="ordinal", mini_batch_size=4, **RELIC_ARGS, **SMALL)
    with pytest.raises(ValueError, match="last training batch holds 2 images.*drop_last: true"):
        _fit(relic, _shapes(views=_relic_views(), train_size=34, drop_last=False), tmp_path)
    with pytest.raises(ValueError, match="mini_batch_size must be a positive integer"):
        ReLICModule(mini_batch_size=0)


def test_encoder_ckpt_missing_or_from_the_wrong_module(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs encoder_ckpt"):
        LinearProbeModule(num_classes=4)
    with pytest.raises(FileNotFoundError, match="does not exist; give the .ckpt of a stage-one run"):
        LinearProbeModule(num_classes=4, encoder_ckpt=str(tmp_path / "missing.ckpt"))
    margins = tmp_path / "cloc_margins.yaml"  # a file of the wrong kind
    margins.write_text(yaml.safe_dump({"learnable_map": [["fixed", 0.5]] * 3}))
    with pytest.raises(ValueError, match="cannot read .* as a PyTorch checkpoint"):
        LinearProbeModule(num_classes=4, encoder_ckpt=str(margins))
    # an OrdinalCLIP checkpoint: its image encoder is a CLIP visual tower, not a timm backbone
    clip = OrdinalCLIPModule(num_classes=4, clip_model="ViT-S-32-alt", clip_config=TINY_CLIP, num_context_tokens=4)
    trainer = _trainer(tmp_path)
    trainer.strategy.connect(clip)
    trainer.save_checkpoint(str(tmp_path / "oc.ckpt"))
    with pytest.raises(ValueError, match="CLIP visual tower, not a timm backbone.*image_encoder: timm"):
        LinearProbeModule(num_classes=4, encoder_ckpt=str(tmp_path / "oc.ckpt"))
    torch.save({"optimizer_states": [], "epoch": 3}, tmp_path / "no_weights.ckpt")
    with pytest.raises(ValueError, match="neither a Lightning checkpoint nor a state_dict"):
        LinearProbeModule(num_classes=4, encoder_ckpt=str(tmp_path / "no_weights.ckpt"))
    # the right kind (a CLOC checkpoint) works, and a wrong architecture override is named
    assert LinearProbeModule(num_classes=4, encoder_ckpt=str(FIXTURE_CKPT)).feature_dim == 16
    with pytest.raises(ValueError, match="backbone mismatch"):
        LinearProbeModule(num_classes=4, encoder_ckpt=str(FIXTURE_CKPT), backbone="resnet18")


def test_phase_two_margin_yaml_of_the_wrong_length(tmp_path: Path) -> None:
    """A margins file written for another number of classes or margin mode is refused, naming it."""
    five = tmp_path / "five_classes.yaml"  # CLOCMarginFreeze's format, from a 5-class mm run
    five.write_text(yaml.safe_dump({"learnable_map": [["fixed", 0.5]] * 4, "margin_mode": "mm", "n_classes": 5}))
    single = tmp_path / "sm.yaml"
    single.write_text(yaml.safe_dump({"learnable_map": [["fixed", 0.5]], "margin_mode": "sm"}))
    with pytest.raises(ValueError, match="has 4 entries but .*needs exactly 3.*phase-two margin YAML"):
        CLOCModule(num_classes=4, learnable_map=str(five), **SMALL)
    with pytest.raises(ValueError, match="has 1 entries but .*needs exactly 3"):
        CLOCModule(num_classes=4, learnable_map=str(single), **SMALL)
    with pytest.raises(ValueError, match="has 4 entries but OrdinalContrastiveLoss_sm"):
        CLOCModule(num_classes=4, margin_mode="sm", learnable_map=str(five), **SMALL)
    with pytest.raises(FileNotFoundError, match="CLOCMarginFreeze"):
        CLOCModule(num_classes=4, learnable_map=str(tmp_path / "typo.yaml"), **SMALL)
    (tmp_path / "other.yaml").write_text(yaml.safe_dump({"margins": [0.5, 0.5, 0.5]}))
    with pytest.raises(ValueError, match="has no 'learnable_map' key"):
        CLOCModule(num_classes=4, learnable_map=str(tmp_path / "other.yaml"), **SMALL)


# =============================================================================================
# faults
# =============================================================================================
#: model + data of the kill/resume runs: 4 steps per epoch, random augmentation
RESUME_SETUPS: dict[str, dict[str, Any]] = {
    # CLOC: 3 epochs, margins learned in epoch 0 and frozen from epoch 1 (CLOCMarginFreeze)
    "cloc": {
        "max_epochs": 3,
        "callbacks": [{"class_path": "cloc_lightning.callbacks.CLOCMarginFreeze", "init_args": {"freeze_at_epoch": 1}}],
        "model": {"class_path": "cloc_lightning.methods.CLOCModule",
                  "init_args": {"num_classes": 4, **SMALL, "margin_lr": 0.05, "lr": 0.003}},
        "data": {"augment": "crop_flip"},
    },
    # ReLIC: 2 epochs, EMA target from step 2 on (cosine beta), gamma decaying over 6 steps, cosine LR, multi-crop
    "relic": {
        "max_epochs": 2,
        "callbacks": [],
        "model": {"class_path": "cloc_lightning.methods.ReLICModule",
                  "init_args": {"num_classes": 4, "task": "ordinal", **RELIC_ARGS, **SMALL, "scheduler": "cosine"}},
        "data": {"train_size": 32, "val_size": 8, "batch_size": 8, "train_views": {
            "class_path": "cloc_lightning.data.MultiCropViews",
            "init_args": {"num_global_views": 2, "num_local_views": 1, "local_size": 24}}},
    },
}


def _cli_config(tmp_path: Path, name: str, extra_callbacks: list[dict] | None = None, setup: str = "cloc") -> Path:
    """A CLI fit of ``RESUME_SETUPS[setup]`` that writes ``last.ckpt`` after every training step."""
    spec = RESUME_SETUPS[setup]
    cfg = {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu", "devices": 1, "max_epochs": spec["max_epochs"], "deterministic": True,
            "log_every_n_steps": 1, "enable_progress_bar": False, "enable_model_summary": False,
            "logger": {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                       "init_args": {"save_dir": "runs", "name": name}},
            "callbacks": [
                *spec["callbacks"],
                {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
                 "init_args": {"every_n_train_steps": 1, "save_last": True}},
                *(extra_callbacks or []),
            ],
        },
        "model": spec["model"],
        "data": {"class_path": "cloc_lightning.data.OrdinalShapesDataModule", "init_args": {
            "num_classes": 4, "train_size": 64, "val_size": 16, "test_size": 16, "batch_size": 16,
            "num_workers": 0, **spec["data"]}},
    }
    path = tmp_path / f"{name}_{len(extra_callbacks or [])}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def _cli_env() -> dict[str, str]:
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="2", HF_HUB_OFFLINE="1")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _fit_killed_at(tmp_path: Path, name: str, step: int, resume: bool, setup: str = "cloc") -> str:
    """Start a CLI fit, SIGKILL it at the start of training step ``step``; return its output."""
    marker = tmp_path / f"paused_at_{step}"
    cfg = _cli_config(tmp_path, name, [{"class_path": "tests._faults.PauseAtStep",
                                        "init_args": {"step": step, "marker": str(marker)}}], setup)
    args = [sys.executable, "-m", "cloc_lightning", "fit", "--config", str(cfg)] + (["--ckpt_path", "last"] if resume else [])
    log = open(tmp_path / f"killed_at_{step}.log", "w+")
    proc = subprocess.Popen(args, cwd=tmp_path, env=_cli_env(), stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        while not marker.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                raise AssertionError(f"the run did not reach step {step} (rc={proc.returncode}):\n{log.read()[-4000:]}")
            time.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
    log.seek(0)
    return log.read()


def _last_ckpt(run_dir: Path) -> Path:
    found = sorted(run_dir.glob("version_*/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime)
    assert found, f"no last.ckpt under {run_dir}"
    return found[-1]


def assert_same(a: Any, b: Any, where: str = "checkpoint") -> None:
    """Exact equality of nested checkpoint contents (tensors bit for bit)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), f"{where} differs (max |diff| {float((a.double() - b.double()).abs().max()):.3g})"
    elif isinstance(a, dict):
        assert set(a) == set(b), f"{where}: keys {sorted(set(a) ^ set(b))}"
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


@pytest.mark.slow
def test_cli_fit_killed_and_resumed_equals_an_uninterrupted_run(tmp_path: Path) -> None:
    """SIGKILL at the epoch 0/1 boundary (the margin freeze then happens in the resumed run) and mid-epoch 1
    (margins frozen, one optimiser group); each time resume with ``--ckpt_path last``.  The final checkpoint
    equals the uninterrupted run's bit for bit: weights, margins, Adam state, LR schedule, loop progress,
    CLOC phase state.  (Mid-epoch with learnable margins: ``test_resume_in_process_...``.)"""
    run_cli(["fit", "--config", str(_cli_config(tmp_path, "reference"))], tmp_path, timeout=300)
    reference = torch.load(_last_ckpt(tmp_path / "runs" / "reference"), map_location="cpu", weights_only=False)
    assert reference["global_step"] == 12 and reference["cloc"]["margins_frozen"]

    # first run: nothing to resume yet; killed at the epoch 0/1 boundary (last.ckpt: end of epoch 0, before the freeze)
    out = _fit_killed_at(tmp_path, "chain", 4, resume=True)
    assert "--ckpt_path last: no last checkpoint found for this run; training starts from scratch" in out
    out = _fit_killed_at(tmp_path, "chain", 6, resume=True)  # freezes on resume; killed mid-epoch 1
    assert "--ckpt_path last: resuming from" in out and "version_0" in out
    final = run_cli(["fit", "--config", str(_cli_config(tmp_path, "chain")), "--ckpt_path", "last"], tmp_path, timeout=300)
    assert "--ckpt_path last: resuming from" in final.stdout and "logging into its run folder version_0" in final.stdout
    assert len(list((tmp_path / "runs" / "chain").glob("version_*"))) == 1  # every restart logged into the first run's folder

    resumed = torch.load(_last_ckpt(tmp_path / "runs" / "chain"), map_location="cpu", weights_only=False)
    assert_same(resumed["state_dict"], reference["state_dict"], "state_dict")
    assert_same(resumed["optimizer_states"], reference["optimizer_states"], "optimizer_states")
    assert_same(resumed["lr_schedulers"], reference["lr_schedulers"], "lr_schedulers")
    assert_same(resumed["cloc"], reference["cloc"], "cloc")
    assert_same(resumed["callbacks"]["CLOCMarginFreeze"], reference["callbacks"]["CLOCMarginFreeze"], "freeze")
    assert_same(resumed["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"],
                reference["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"], "batch_progress")
    assert (resumed["global_step"], resumed["epoch"]) == (reference["global_step"], reference["epoch"])
    assert len(resumed["optimizer_states"][0]["param_groups"]) == 1  # the margins group left at the freeze


@pytest.mark.slow
def test_cli_relic_fit_killed_mid_epoch_and_resumed_equals_an_uninterrupted_run(tmp_path: Path) -> None:
    """ReLIC: online + EMA target (cosine beta), gamma schedule, learnable tau/b, cosine LR, multi-crop views.
    SIGKILL at step 5 (mid-epoch 1), resume with ``--ckpt_path last``: the final checkpoint equals the
    uninterrupted run's (target encoder/projector included) bit for bit."""
    run_cli(["fit", "--config", str(_cli_config(tmp_path, "reference", setup="relic"))], tmp_path, timeout=300)
    reference = torch.load(_last_ckpt(tmp_path / "runs" / "reference"), map_location="cpu", weights_only=False)
    assert reference["global_step"] == 8
    _fit_killed_at(tmp_path, "chain", 5, resume=True, setup="relic")
    final = run_cli(["fit", "--config", str(_cli_config(tmp_path, "chain", setup="relic")), "--ckpt_path", "last"],
                    tmp_path, timeout=300)
    assert "--ckpt_path last: resuming from" in final.stdout
    resumed = torch.load(_last_ckpt(tmp_path / "runs" / "chain"), map_location="cpu", weights_only=False)
    assert any(k.startswith("target_encoder.") for k in resumed["state_dict"])
    assert_same(resumed["state_dict"], reference["state_dict"], "state_dict")  # online, target, tau, b, probe
    assert_same(resumed["optimizer_states"], reference["optimizer_states"], "optimizer_states")
    assert_same(resumed["lr_schedulers"], reference["lr_schedulers"], "lr_schedulers")
    assert (resumed["global_step"], resumed["epoch"]) == (reference["global_step"], reference["epoch"])


@pytest.mark.parametrize("method", ["cloc", "relic-mini-batches"])
def test_resume_in_process_is_exact_mid_epoch_with_random_augmentation(method: str, tmp_path: Path) -> None:
    """The Python API gets the same guarantee: stop after step 3 of 4 (mid-epoch 1), resume, compare to one fit.
    CLOC with learnable margins and random crops+flips; ReLIC with ``mini_batch_size`` (manual optimisation)."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    class Killed(Exception):
        pass

    class Stop(L.Callback):
        def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
            if trainer.global_step == 3:
                raise Killed

    def run(folder: str, ckpt: str | None = None, stop: bool = False) -> tuple[L.LightningModule, L.Trainer]:
        L.seed_everything(0, verbose=False)
        if method == "cloc":
            model: L.LightningModule = CLOCModule(num_classes=4, **SMALL, margin_lr=0.05)
            dm = _shapes(augment="crop_flip", batch_size=16)
        else:
            model = ReLICModule(num_classes=4, task="ordinal", mini_batch_size=8, **RELIC_ARGS, **SMALL)
            dm = _shapes(views=_relic_views(), batch_size=16)
        callbacks: list[L.Callback] = [ModelCheckpoint(dirpath=str(tmp_path / folder), every_n_train_steps=1, save_last=True)]
        if stop:
            callbacks.append(Stop())
        trainer = _trainer(tmp_path, max_epochs=2, limit_train_batches=None, limit_val_batches=0, callbacks=callbacks,
                           enable_checkpointing=True, deterministic=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                trainer.fit(model, datamodule=dm, ckpt_path=ckpt)
            except Killed:
                pass
        return model, trainer

    full, _ = run("full")
    _, stopped = run("part", stop=True)
    assert stopped.global_step == 3  # killed in the middle of epoch 1 (2 steps per epoch)
    resumed, trainer = run("part", ckpt=str(tmp_path / "part" / "last.ckpt"))
    assert trainer.global_step == 4
    assert_same(resumed.state_dict(), full.state_dict(), "state_dict")


def test_stored_fixture_loads_strictly_and_predicts_the_stored_outputs() -> None:
    """A checkpoint written by an earlier build (tests/fixtures/make_fixtures.py) keeps loading."""
    assert FIXTURE_CKPT.stat().st_size < 500 * 1024
    stored = torch.load(FIXTURE_OUTPUTS, map_location="cpu", weights_only=False)
    for location in ("cpu", torch.device("cpu"), {"cuda:0": "cpu"}, lambda storage, loc: storage):
        model = CLOCModule.load_from_checkpoint(str(FIXTURE_CKPT), map_location=location, strict=True, weights_only=False)
        model.eval()
        assert model.margins_frozen and not model.cloc_loss.learnables.requires_grad  # phase two state
        with torch.no_grad():
            torch.testing.assert_close(model(stored["images"]), stored["logits"], rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(model.embed(stored["images"]), stored["embedding"], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(model.cloc_loss.margins().detach(), stored["margins"])
        assert model.cloc_loss.to_learnable_map("fixed") == stored["learnable_map"]


def test_stored_fixture_resumes_training(tmp_path: Path) -> None:
    """Not only the weights: optimiser, schedule, loops and callback states of the stored checkpoint resume."""
    stored = torch.load(FIXTURE_OUTPUTS, map_location="cpu", weights_only=False)
    model = CLOCModule(num_classes=4, **SMALL, margin_lr=0.05)
    trainer = _trainer(tmp_path, max_epochs=3, limit_train_batches=None, limit_val_batches=0,
                       callbacks=[CLOCMarginFreeze(freeze_at_epoch=1, filename="m.yaml")])
    dm = _shapes(train_size=32, val_size=16, test_size=16, batch_size=16)  # the fixture's data: 2 steps per epoch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, datamodule=dm, ckpt_path=str(FIXTURE_CKPT))
    assert trainer.global_step == 6  # 2 stored epochs + 1 more, 2 steps each
    assert model.margins_frozen and torch.equal(model.cloc_loss.margins().detach(), stored["margins"])
    assert _all_finite(model)


def test_checkpoint_map_location_and_strict_loading(tmp_path: Path) -> None:
    """Save on CPU; load with map_location as str / torch.device / dict / callable; strict catches foreign keys;
    a float64 copy of the weights loads into the float32 module."""
    torch.manual_seed(0)
    model = CLOCModule(num_classes=4, **SMALL)
    trainer = _fit(model, _shapes(), tmp_path, limit_train_batches=2, limit_val_batches=0)
    path = tmp_path / "m.ckpt"
    trainer.save_checkpoint(str(path))
    model.eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = model(x)
    for location in ("cpu", torch.device("cpu"), {"cpu": "cpu"}, lambda storage, loc: storage):
        loaded = CLOCModule.load_from_checkpoint(str(path), map_location=location, strict=True, weights_only=False).eval()
        assert all(p.device.type == "cpu" for p in loaded.parameters())
        with torch.no_grad():
            torch.testing.assert_close(loaded(x), expected, rtol=0, atol=0)
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    ckpt["state_dict"] = {k: v.double() if v.is_floating_point() else v for k, v in ckpt["state_dict"].items()}
    torch.save(ckpt, tmp_path / "f64.ckpt")
    loaded = CLOCModule.load_from_checkpoint(str(tmp_path / "f64.ckpt"), map_location="cpu", strict=True, weights_only=False)
    assert all(p.dtype == torch.float32 for p in loaded.parameters())
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(x), expected)
    ckpt["state_dict"]["extra.weight"] = torch.zeros(1)
    torch.save(ckpt, tmp_path / "extra.ckpt")
    with pytest.raises(RuntimeError, match="Unexpected key.*extra.weight"):
        CLOCModule.load_from_checkpoint(str(tmp_path / "extra.ckpt"), strict=True, weights_only=False)
    with pytest.warns(UserWarning, match="not in the model state dict.*extra.weight"):  # strict=False: named, not fatal
        CLOCModule.load_from_checkpoint(str(tmp_path / "extra.ckpt"), strict=False, weights_only=False)


@pytest.mark.slow
def test_fixture_generator_regenerates_a_small_loadable_checkpoint(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(FIXTURES / "make_fixtures.py"), "--out", str(tmp_path)],
                          cwd=tmp_path, env=_cli_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ckpt = tmp_path / FIXTURE_CKPT.name
    assert ckpt.stat().st_size < 500 * 1024 and sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [FIXTURE_CKPT.name, FIXTURE_OUTPUTS.name])
    model = CLOCModule.load_from_checkpoint(str(ckpt), map_location="cpu", strict=True, weights_only=False).eval()
    outputs = torch.load(tmp_path / FIXTURE_OUTPUTS.name, weights_only=False)
    with torch.no_grad():
        torch.testing.assert_close(model(outputs["images"]), outputs["logits"])


# ---------------------------------------------------------------- mixed precision
@pytest.mark.parametrize("name", sorted(MODULES))
def test_bf16_mixed_cpu_fit_stays_finite(name: str, tmp_path: Path) -> None:
    model, dm = _make(name)
    losses: list[float] = []

    class Record(L.Callback):
        def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            losses.append(float(outputs["loss"] if isinstance(outputs, dict) else outputs))

    before = {k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad}
    _fit(model, dm, tmp_path, precision="bf16-mixed", callbacks=[Record()], limit_train_batches=3)
    assert len(losses) == 3 and all(math.isfinite(v) for v in losses), losses
    assert _all_finite(model)
    assert any(not torch.equal(p.detach(), before[k]) for k, p in model.named_parameters() if k in before)


def _views(x: torch.Tensor) -> torch.Tensor:
    return F.normalize(x.view(-1, 2, x.shape[1]), dim=-1)


#: (prepare the loss input from [32, 16] float64 data, the loss of that input and labels [32] % 6)
LOW_PRECISION_LOSSES: dict[
    str, tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]
] = {
    "cloc_mm": (lambda x: x, lambda x, y: OrdinalContrastiveLoss_mm(6, x.device, [["fixed", 0.3]] * 5)(x, y)),
    "cloc_sm": (lambda x: x, lambda x, y: OrdinalContrastiveLoss_sm(6, x.device, [["fixed", 0.3]])(x, y)),
    "supcon_t0.05": (_views, lambda f, y: SupConLoss(0.05)(f, y[::2])),
    "simclr_t0.05": (_views, lambda f, y: SupConLoss(0.05)(f)),
    "ordinal_clip": (lambda x: x[:, :6] * 30.0, lambda z, y: OrdinalCLIPLoss()(z, y)),
    "sigmoid": (lambda x: x, lambda z, y: SigmoidContrastiveLoss(alpha=1.0, gamma=1.0).to(z.device)(z[:16], z[16:])),
}


def _check_float32_inside(loss: str, dtype: torch.dtype, device: str) -> None:
    torch.manual_seed(0)
    prepare, fn = LOW_PRECISION_LOSSES[loss]
    z = prepare(torch.randn(32, 16, dtype=torch.float64)).to(device=device, dtype=dtype)
    y = (torch.arange(32) % 6).to(device)
    leaf = z.clone().requires_grad_(True)
    with torch.autocast(device, dtype=dtype):
        low = fn(leaf, y)
    assert low.dtype == torch.float32 and bool(torch.isfinite(low))
    low.backward()
    assert leaf.grad is not None and bool(torch.isfinite(leaf.grad).all())
    exact = fn(z.double(), y)  # the same low-precision-representable values, computed in float64
    assert float(low.detach()) == pytest.approx(float(exact.detach()), rel=2e-6, abs=1e-6)


@pytest.mark.parametrize("loss", sorted(LOW_PRECISION_LOSSES))
def test_losses_compute_in_float32_from_bf16_inputs(loss: str) -> None:
    """bf16 inputs under bf16 autocast give the float32 result (~1e-6), not a bf16 one (~1e-2 off), and stay finite."""
    _check_float32_inside(loss, torch.bfloat16, "cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="16-mixed needs a CUDA GPU")
@pytest.mark.parametrize("loss", sorted(LOW_PRECISION_LOSSES))
def test_losses_compute_in_float32_from_fp16_inputs_on_gpu(loss: str) -> None:
    """The same under fp16 autocast on a GPU (``16-mixed``): no overflow at temperature 0.05."""
    _check_float32_inside(loss, torch.float16, "cuda")


# ---------------------------------------------------------------- data loader faults
def test_dying_loader_worker_is_a_clear_error_not_a_hang(tmp_path: Path) -> None:
    script = (
        "import warnings, lightning as L, torch\n"
        "from torch.utils.data import DataLoader\n"
        "from tests._faults import DyingWorkerDataset\n"
        "from cloc_lightning.methods import CEModule\n"
        "warnings.simplefilter('ignore')\n"
        "model = CEModule(num_classes=2, backbone='test_resnet', backbone_kwargs={'channels': [8, 8, 16, 16]})\n"
        "loader = DataLoader(DyingWorkerDataset(), batch_size=4, num_workers=1, persistent_workers=True)\n"
        "trainer = L.Trainer(max_epochs=1, accelerator='cpu', logger=False, enable_checkpointing=False,\n"
        "                    enable_progress_bar=False, enable_model_summary=False)\n"
        "trainer.fit(model, train_dataloaders=loader)\n"
    )
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=_cli_env(), capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode != 0
    assert "DataLoader worker (pid" in proc.stderr and "exited unexpectedly" in proc.stderr, proc.stderr[-3000:]
    assert time.monotonic() - t0 < 180


@pytest.mark.parametrize("workers", [0, 1])
def test_file_corrupted_mid_epoch_names_the_file(workers: int, tmp_path: Path) -> None:
    """The file is fine at setup and broken when the loader reaches it (e.g. a network disk): the error names it."""
    root = _folder(tmp_path / "data", n=20)
    dm = ImageFolderDataModule(str(root), val_fraction=0.25, batch_size=4, num_workers=workers, augment="none")
    dm.setup("fit")
    order = list(dm.train_dataloader().sampler)  # epoch 0's order (the epoch-seeded sampler)
    last = len(order) // 4 * 4 - 1  # the last sample of the last full batch (drop_last)
    assert last >= 23  # batch 6 or later: at most batches 0-3 can be loaded when step 0 ends
    victim = Path(dm.train_set.base.files[dm.train_set.indices[order[last]]])

    class Corrupt(L.Callback):
        def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
            if trainer.global_step == 1:  # after the first step; loader workers prefetch 2 batches ahead
                victim.write_bytes(b"\x00 not an image any more")

    model = CEModule(num_classes=2, **SMALL)
    with pytest.raises(RuntimeError, match=rf"Cannot read image '.*{victim.name}'.*bad_files: skip"):
        _fit(model, dm, tmp_path, callbacks=[Corrupt()], limit_train_batches=None, limit_val_batches=0)
