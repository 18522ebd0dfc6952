"""Bad input every Lightning module shares (``cloc_lightning/methods/base.py``): class counts that do not match the
data, NaN inputs and gradients, multi-view counts that do not match the module, bf16-mixed fits that stay finite.

A module's own bad input is tested beside it (``test_cloc_module.py``: margin maps and phase-two margin files;
``test_relic_module.py``: mini-batch sizes; ``test_linear_probe.py``: encoder checkpoints).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch

from cloc_lightning.data import (
    MultiCropViews,
    OrdinalShapesDataModule,
)
from cloc_lightning.methods import CLOCModule, ReLICModule, SupConModule
from tests._reliability import (
    MODULES,
    RELIC_ARGS,
    SMALL,
    _all_finite,
    _fit,
    _make,
    _shapes,
)


@pytest.mark.parametrize("name", ["CEModule", "CLOCModule", "SupConModule-supcon", "LinearProbeModule", "OrdinalCLIPModule", "ReLICModule"])
def test_num_classes_mismatching_the_data(name: str, tmp_path: Path) -> None:
    model, dm = _make(name, n=5)
    with pytest.raises(ValueError, match=r"num_classes=5 but OrdinalShapesDataModule has 4 classes.*num_classes 4"):
        _fit(model, dm, tmp_path)


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
    dm = _NaNShapes(
        num_classes=4,
        train_size=32,
        val_size=8,
        test_size=8,
        batch_size=8,
        num_workers=0,
        image_size=dm.image_size,
        augment="none",
        train_views=dm.train_views,
    )
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
