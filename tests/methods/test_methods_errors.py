"""Reliability of the Lightning modules: class counts, margin maps, NaN inputs and gradients, view counts,
mini-batch sizes, encoder checkpoints, phase-two margin files, bf16-mixed fits.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
import yaml

from cloc_lightning.data import (
    MultiCropViews,
    OrdinalShapesDataModule,
)
from cloc_lightning.methods import CLOCModule, LinearProbeModule, OrdinalCLIPModule, ReLICModule, SupConModule
from tests._reliability import (
    FIXTURE_CKPT,
    MODULES,
    RELIC_ARGS,
    SMALL,
    TINY_CLIP,
    _all_finite,
    _fit,
    _make,
    _relic_views,
    _shapes,
    _trainer,
)


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


class _NaNShapes(OrdinalShapesDataModule):
    """Training images (every view) are NaN: what a diverged upstream or a broken decoder delivers."""

    def train_image_transform(self) -> Callable[[Any], Any]:
        base = super().train_image_transform()

        def poisoned(img: Any) -> Any:
            out = base(img)
            return [v * float("nan") for v in out] if isinstance(out, (list, tuple)) else out * float("nan")

        return poisoned


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "deferred"])
@pytest.mark.parametrize("name", sorted(MODULES))
def test_nan_inputs_stop_every_module(name: str, strict: bool, tmp_path: Path) -> None:
    """``strict_checks``: stopped at the first step, before the weights change.  Default (checks read every
    ``log_every_n_steps``, at epoch end and before checkpoints): stopped with the same message, no checkpoint written."""
    model, dm = _make(name, strict_checks=strict)
    dm = _NaNShapes(num_classes=4, train_size=32, val_size=8, test_size=8, batch_size=8, num_workers=0,
                    image_size=dm.image_size, augment="none", train_views=dm.train_views)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    with pytest.raises((ValueError, FloatingPointError), match="NaN|not finite") as info:
        _fit(model, dm, tmp_path, enable_checkpointing=True)
    assert "learning rate" in str(info.value)
    assert not list(tmp_path.rglob("*.ckpt"))
    if strict:
        assert _all_finite(model)
        assert all(torch.equal(p.detach(), before[k]) for k, p in model.named_parameters())  # no NaN update
    else:
        assert "first failed 0 batch(es) after the previous check" in str(info.value)


def test_non_finite_gradients_with_a_finite_loss_stop_before_the_step(tmp_path: Path) -> None:
    """A backward kernel that returns NaN (PyTorch 2.14's CPU bf16 convolution does so, sporadically, for 1x1
    feature maps) leaves the loss finite: the gradient check stops the run; with ``strict_checks`` it names the
    parameter and keeps the weights."""
    model, dm = _make("CEModule")
    model.head.weight.register_hook(lambda g: g * float("nan"))
    with pytest.raises(FloatingPointError, match=r"non-finite gradients .*32-true.*strict_checks"):
        _fit(model, dm, tmp_path)
    model, dm = _make("CEModule", strict_checks=True)
    model.head.weight.register_hook(lambda g: g * float("nan"))
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    with pytest.raises(FloatingPointError, match=r"non-finite gradients .*32-true.*\['head.weight'\]"):
        _fit(model, dm, tmp_path)
    assert all(torch.equal(p.detach(), before[k]) for k, p in model.named_parameters())


def test_non_finite_loss_check_can_be_turned_off(tmp_path: Path) -> None:
    """``check_finite_loss: false`` lets a NaN loss through (documented escape hatch); default stops."""
    model, _ = _make("CEModule", check_finite_loss=False)
    dm = _NaNShapes(num_classes=4, train_size=32, val_size=8, test_size=8, batch_size=8, num_workers=0, augment="none")
    _fit(model, dm, tmp_path, limit_train_batches=1, limit_val_batches=0)
    assert not _all_finite(model)  # exactly what the default check prevents


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
