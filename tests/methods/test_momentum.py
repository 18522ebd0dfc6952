"""``MomentumModule`` (cloc_lightning/methods/momentum.py) on its own, through a method written the way a user would.

``_TinyBYOL`` is a complete momentum method in a dozen lines: a small conv encoder, a predictor,
a momentum copy of its own encoder and a regression of the online prediction onto the target's
features.  Its target is checked after every optimiser step of a real fit against the EMA
formula computed here, in float64, from the online weights the test records (not with the
module's code); also: the schedule hook, manual optimisation, exact resume, ``init_from``, the
targets' registration and the errors that name the fix.  ReLIC's use of the base:
``tests/methods/test_relic_module.py``; the update itself: ``tests/nn/test_ema.py``.
"""

from __future__ import annotations

import inspect
import itertools
import math
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

from cloc_lightning.methods import MomentumModule
from tests.conftest import cpu_trainer, tiny_shapes
from tests.methods.test_method_defaults import constructor_chain

QUIET = dict(online_probe=False, knn_k=0)

pytestmark = pytest.mark.filterwarnings("ignore:.*self.trainer.*reference is not registered:UserWarning")

_trainer = partial(cpu_trainer, num_sanity_val_steps=0, limit_val_batches=0, log_every_n_steps=1, enable_checkpointing=False)


def _dm() -> L.LightningDataModule:
    """16 images of 16 px in batches of 4: 4 optimiser steps per epoch, the same batches in every run."""
    return tiny_shapes(train_size=16, val_size=4, test_size=4, batch_size=4, image_size=16, augment="none")


class _TinyBYOL(MomentumModule):
    """What a user writes: the networks, ``add_momentum_targets()`` once they exist, and the loss."""

    def __init__(self, manual: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.predictor = nn.Linear(self.feature_dim, self.feature_dim)
        self.add_momentum_targets()  # target_encoder: a frozen copy of the backbone
        self.automatic_optimization = not manual

    def build_backbone(self) -> tuple[nn.Module, int]:
        # BatchNorm: its running statistics (float buffers) and num_batches_tracked (an integer buffer) follow too
        net = nn.Sequential(nn.Conv2d(3, 4, 3, stride=2), nn.BatchNorm2d(4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        return net, 4

    def loss(self, batch: Any) -> torch.Tensor:
        x, _ = batch
        with torch.no_grad():  # eval mode: the target's BatchNorm statistics move by the EMA only (BYOL's would also by this forward)
            target = self.target_encoder.eval()(x)
        loss = (self.predictor(self.backbone(x)) - target).pow(2).mean()
        self.log("train/loss", loss.detach())
        return loss

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.automatic_optimization:
            return self.loss(batch)

        def accumulate() -> torch.Tensor:
            loss = self.loss(batch)
            self.manual_backward(loss)
            return loss.detach()

        return self.manual_optimizer_step(self._step(), accumulate)


def _make(**kw: Any) -> _TinyBYOL:
    torch.manual_seed(0)
    args: dict[str, Any] = dict(optimizer="sgd", lr=0.2, momentum=0.0, scheduler="cosine", **QUIET)
    args.update(kw)
    return _TinyBYOL(**args)


def _state(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


class _Record(L.Callback):
    """After every optimiser step: the online encoder's and the target's state, and the learning rate."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, dict[str, torch.Tensor], dict[str, torch.Tensor], float]] = []

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, *args: object) -> None:
        lr = trainer.optimizers[0].param_groups[0]["lr"]
        self.steps.append((trainer.global_step - 1, _state(pl_module.backbone), _state(pl_module.target_encoder), lr))


def _ema_reference(
    initial: dict[str, torch.Tensor], online: list[dict[str, torch.Tensor]], betas: list[float | None]
) -> list[dict[str, torch.Tensor]]:
    """The target after each step, in float64: ``beta * target + (1 - beta) * online``; ``None`` keeps it; integers copied."""
    target = {k: v.double() if v.is_floating_point() else v.clone() for k, v in initial.items()}
    out = []
    for state, beta in zip(online, betas, strict=True):
        if beta is not None:
            for k, o in state.items():
                target[k] = beta * target[k] + (1.0 - beta) * o.double() if o.is_floating_point() else o.clone()
        out.append({k: v.clone() for k, v in target.items()})
    return out


def _cosine(k: int, total: int, beta0: float) -> float:
    return 1.0 - (1.0 - beta0) * (math.cos(math.pi * k / total) + 1.0) / 2.0


def _assert_target_follows(record: _Record, initial: dict[str, torch.Tensor], betas: list[float | None]) -> None:
    expected = _ema_reference(initial, [online for _, online, _, _ in record.steps], betas)
    moved = 0
    for (step, online, target, _), ref in zip(record.steps, expected, strict=True):
        for k, t in target.items():
            if t.is_floating_point():
                torch.testing.assert_close(t.double(), ref[k], rtol=0, atol=1e-6, msg=f"step {step}: {k}")
            else:
                assert torch.equal(t, ref[k]), (step, k)
        moved += any(not torch.equal(online[k], target[k]) for k in target if target[k].is_floating_point())
    assert moved >= 2  # the EMA steps left the target behind the online encoder


# ------------------------------------------------------------------ the EMA over a fit
@pytest.mark.parametrize("manual", [False, True], ids=["automatic", "manual_optimizer_step"])
def test_user_subclass_target_equals_the_ema_formula_after_every_step(manual: bool, tmp_path: Path) -> None:
    """7 steps, copies after steps 0-1, then an EMA every 2nd step with the cosine beta of the run (0.5 -> 1)."""
    L.seed_everything(0)
    m = _make(manual=manual, beta=0.5, update_beta_after_step=1, update_beta_every_n_steps=2)
    initial = _state(m.backbone)
    assert all(torch.equal(initial[k], v) for k, v in _state(m.target_encoder).items())  # a copy at construction
    record = _Record()
    trainer = _trainer(tmp_path, max_steps=7, callbacks=[record])
    trainer.fit(m, datamodule=_dm())
    assert trainer.global_step == 7 and [s for s, *_ in record.steps] == list(range(7))
    betas: list[float | None] = [0.0, 0.0, _cosine(2, 7, 0.5), None, _cosine(4, 7, 0.5), None, _cosine(6, 7, 0.5)]
    _assert_target_follows(record, initial, betas)
    assert float(trainer.callback_metrics["train/beta"]) == pytest.approx(_cosine(6, 7, 0.5))
    assert not any(p.requires_grad for p in m.target_encoder.parameters())
    lrs = [lr for *_, lr in record.steps]
    assert lrs[0] < 0.2 and all(b < a for a, b in itertools.pairwise(lrs))  # the cosine LR stepped every step


def test_manual_optimizer_step_trains_exactly_as_automatic_optimisation(tmp_path: Path) -> None:
    """Online weights, target and learning-rate schedule: the same numbers on both paths."""
    states = []
    for manual in (False, True):
        L.seed_everything(0)
        m = _make(manual=manual, beta=0.9, update_beta_after_step=0)
        _trainer(tmp_path / str(manual), max_steps=5).fit(m, datamodule=_dm())
        states.append(_state(m))
    assert states[0].keys() == states[1].keys()
    for k, v in states[0].items():
        assert torch.equal(v, states[1][k]), k


def test_the_schedule_hook_beta_at(tmp_path: Path) -> None:
    """A subclass overriding ``beta_at`` (a constant momentum) gets that coefficient on every EMA step."""

    class ConstantMomentum(_TinyBYOL):
        def beta_at(self, step: int) -> float:
            return 0.75

    L.seed_everything(0)
    torch.manual_seed(0)
    m = ConstantMomentum(optimizer="sgd", lr=0.2, momentum=0.0, update_beta_after_step=0, **QUIET)
    initial = _state(m.backbone)
    record = _Record()
    trainer = _trainer(tmp_path, max_steps=4, callbacks=[record])
    trainer.fit(m, datamodule=_dm())
    _assert_target_follows(record, initial, [0.0, 0.75, 0.75, 0.75])
    assert m.effective_beta(0) == 0.0 and m.effective_beta(3) == 0.75
    assert float(trainer.callback_metrics["train/beta"]) == 0.75


# ------------------------------------------------------------------ resume, init_from
def test_resume_from_a_step_checkpoint_continues_the_target_exactly(tmp_path: Path) -> None:
    """A checkpoint written at the end of step 5 (mid-epoch 1) holds the target of that step; resuming gives the uninterrupted run."""
    L.seed_everything(0)
    full = _make(beta=0.8, update_beta_after_step=0)
    save = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=6, save_top_k=-1, filename="{step}")
    _trainer(tmp_path / "full", max_steps=8, callbacks=[save], enable_checkpointing=True).fit(full, datamodule=_dm())
    ckpt = tmp_path / "ckpt" / "step=6.ckpt"
    saved = torch.load(ckpt, map_location="cpu", weights_only=False)
    assert saved["global_step"] == 6 and any(k.startswith("target_encoder.") for k in saved["state_dict"])

    L.seed_everything(0)
    resumed = _make(beta=0.8, update_beta_after_step=0)
    _trainer(tmp_path / "resumed", max_steps=8).fit(resumed, datamodule=_dm(), ckpt_path=str(ckpt))
    a, b = _state(full), _state(resumed)
    assert a.keys() == b.keys()
    for k, v in a.items():
        assert torch.equal(v, b[k]), k
    assert any(
        not torch.equal(a[k], a[k.replace("target_encoder.", "backbone.", 1)])
        for k in a
        if k.startswith("target_encoder.") and a[k].is_floating_point()
    )


def test_init_from_without_a_target_copies_the_loaded_online_network(tmp_path: Path) -> None:
    source = _make()
    with torch.no_grad():
        for p in source.backbone.parameters():
            p.add_(1.0)
    path = tmp_path / "online_only.pt"
    torch.save({k: v for k, v in source.state_dict().items() if k.startswith("backbone.")}, path)
    m = _make()
    report = m.load_weights(str(path))
    assert report["loaded"] and not any(k.startswith("target_encoder.") for k in report["loaded"])
    for k, v in _state(m.target_encoder).items():
        assert torch.equal(v, source.backbone.state_dict()[k]), k


# ------------------------------------------------------------------ registration, arguments, errors
def test_momentum_targets_names_the_copies_and_their_state_dict_keys() -> None:
    class TwoCopies(_TinyBYOL):
        momentum_targets: ClassVar[dict[str, str]] = {"backbone": "momentum_backbone", "predictor": "momentum_predictor"}
        backbone_modules = ("backbone", "momentum_backbone")

    m = TwoCopies(**QUIET)
    keys = m.state_dict().keys()
    assert any(k.startswith("momentum_backbone.") for k in keys) and any(k.startswith("momentum_predictor.") for k in keys)
    assert m.ema.momentum_pairs == [(m.backbone, m.momentum_backbone), (m.predictor, m.momentum_predictor)]
    trainable = {id(p) for g in m.param_groups() for p in g["params"]}
    assert not any(id(p) in trainable for p in [*m.momentum_backbone.parameters(), *m.momentum_predictor.parameters()])


def test_arguments_are_the_ema_targets_and_recorded_in_hparams() -> None:
    params = inspect.signature(MomentumModule).parameters
    assert list(params)[:4] == ["beta", "beta_schedule", "update_beta_after_step", "update_beta_every_n_steps"]
    assert {"lr", "backbone", "online_probe"} <= set(constructor_chain(MomentumModule))  # the bases', through **kwargs
    m = _make(beta=0.7, beta_schedule="scl_train", update_beta_every_n_steps=3)
    assert (m.hparams.beta, m.hparams.beta_schedule, m.hparams.update_beta_every_n_steps) == (0.7, "scl_train", 3)
    assert (m.ema.beta, m.ema.beta_schedule, m.ema.update_beta_every_n_steps) == (0.7, "scl_train", 3)
    with pytest.raises(ValueError, match="beta"):
        _make(beta=1.5)
    with pytest.raises(ValueError, match="beta_schedule"):
        _make(beta_schedule="byol")


def test_registration_errors_name_the_fix(tmp_path: Path) -> None:
    class Forgot(_TinyBYOL):
        def add_momentum_targets(self) -> None:  # as if __init__ never called it
            pass

    with pytest.raises(RuntimeError, match=r"call self.add_momentum_targets\(\) at the end of its __init__"):
        _trainer(tmp_path, max_steps=1).fit(Forgot(**QUIET), datamodule=_dm())

    class Missing(_TinyBYOL):
        momentum_targets: ClassVar[dict[str, str]] = {"backbone": "target_encoder", "projector": "target_projector"}

    with pytest.raises(AttributeError, match=r"names 'projector', which is no module of it; build self.projector"):
        Missing(**QUIET)
    m = _make()
    with pytest.raises(RuntimeError, match="already called"):
        m.add_momentum_targets()
