"""Seed fidelity of the shared schedule and backbone initialisation (issue 14).

The SupContrast references below are re-implementations written here from the
behaviour of github.com/HobbitLong/SupContrast (``util.py``: ``adjust_learning_rate``
at the start of each 1-based epoch, ``warmup_learning_rate`` before each batch;
``main_supcon.py``: ``warmup_from = 0.01``, ``warmup_to`` = the cosine at epoch
``warm_epochs``; ``networks/resnet_big.py``: kaiming-normal ``fan_out`` convolutions,
BN 1/0, no zero-init), simulating its training loop batch by batch.
"""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch
from torch import nn

from cloc_lightning.methods.optim import lr_factor
from cloc_lightning.nn.backbones import create_backbone
from tests.conftest import cpu_trainer
from tests.references.schedules import supcontrast_lrs


@pytest.mark.parametrize("lr", [0.05, 0.5])
@pytest.mark.parametrize("epochs,n_batches", [(12, 1), (20, 3), (40, 7), (100, 2)])
@pytest.mark.parametrize("cosine", [True, False])
@pytest.mark.parametrize("warm", [True, False])
def test_epoch_interval_matches_supcontrast(lr: float, epochs: int, n_batches: int, cosine: bool, warm: bool) -> None:
    decay = (int(epochs * 0.7), int(epochs * 0.8), int(epochs * 0.9))
    ref = supcontrast_lrs(lr, epochs, n_batches, cosine, warm, decay)
    total = epochs * n_batches
    ours = [
        lr
        * lr_factor(
            step,
            total,
            n_batches,
            "cosine" if cosine else "step",
            warmup_epochs=10 if warm else 0,
            min_lr_ratio=1e-3,
            milestones=decay,
            gamma=0.1,
            interval="epoch",
            warmup_start=0.01 / lr if warm else None,
            max_epochs=epochs,
        )
        for step in range(total)
    ]
    assert ours == pytest.approx(ref, rel=1e-12, abs=1e-15)


def test_default_step_interval_differs_from_supcontrast() -> None:
    """The default (per-step cosine after a warm-up from ~0) is not SupContrast's: the switch matters."""
    ref = supcontrast_lrs(0.5, 20, 3, cosine=True, warm=True)
    ours = [0.5 * lr_factor(s, 60, 3, "cosine", 10, 1e-3) for s in range(60)]
    assert max(abs(a - b) for a, b in zip(ours, ref, strict=True)) > 0.01


def _lrs_from_trainer(tmp_path, **hparams) -> list[float]:
    """Learning rates the optimiser really used, step by step, in a Lightning fit."""
    from cloc_lightning.data import OrdinalShapesDataModule
    from cloc_lightning.methods.ce import CEModule

    class Recorder(L.Callback):
        def __init__(self) -> None:
            self.lrs: list[float] = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            self.lrs.append(trainer.optimizers[0].param_groups[0]["lr"])

    rec = Recorder()
    model = CEModule(backbone="test_resnet", num_classes=4, optimizer="sgd", **hparams)
    dm = OrdinalShapesDataModule(num_classes=4, image_size=16, batch_size=8, train_size=24, val_size=8, test_size=8, num_workers=0)
    trainer = cpu_trainer(tmp_path, max_epochs=12, callbacks=[rec], enable_checkpointing=False)
    trainer.fit(model, dm)
    return rec.lrs


@pytest.mark.slow  # long tier: a real multi-epoch fit (36 s of the fast tier, measured idle at 788d45e+)
def test_supcontrast_schedule_in_a_real_fit(tmp_path) -> None:
    lrs = _lrs_from_trainer(
        tmp_path, lr=0.5, scheduler="cosine", warmup_epochs=10, min_lr_ratio=1e-3, lr_interval="epoch", warmup_from=0.01
    )
    assert len(lrs) == 36
    assert lrs == pytest.approx(supcontrast_lrs(0.5, 12, 3, cosine=True, warm=True), rel=1e-9)


def test_warmup_from_needs_warmup() -> None:
    from cloc_lightning.methods.ce import CEModule

    with pytest.raises(ValueError, match="warmup_epochs > 0"):
        CEModule(backbone="test_resnet", num_classes=4, warmup_from=0.01)
    with pytest.raises(ValueError, match="lr_interval"):
        CEModule(backbone="test_resnet", num_classes=4, lr_interval="batch")


# ---------------------------------------------------------------- initialisation
def _is_kaiming_fan_out(w: torch.Tensor) -> bool:
    fan_out = w.shape[0] * w[0, 0].numel()
    expected = math.sqrt(2.0 / fan_out)
    return abs(float(w.std()) / expected - 1) < 0.15 and abs(float(w.mean())) < 0.2 * expected


def test_kaiming_init_is_supcontrasts_resnet() -> None:
    torch.manual_seed(0)
    net, _ = create_backbone("resnet18", False, cifar_stem=True, init="kaiming")
    convs = [m for m in net.modules() if isinstance(m, nn.Conv2d)]
    assert len(convs) == 20  # stem + 16 block convs + 3 downsample convs
    for c in convs:  # >= 1728 draws each: the std estimate is within a few per cent
        assert _is_kaiming_fan_out(c.weight.detach()), c
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            assert torch.all(m.weight == 1) and torch.all(m.bias == 0)


def test_timm_init_differs_where_the_issue_says() -> None:
    torch.manual_seed(0)
    net, _ = create_backbone("resnet18", False, cifar_stem=True)
    last_bns = [blk.bn2 for layer in (net.layer1, net.layer2, net.layer3, net.layer4) for blk in layer]
    assert all(torch.all(bn.weight == 0) for bn in last_bns)  # timm zero-inits the last BN of each block
    w = net.conv1.weight  # the CIFAR stem: PyTorch default kaiming-uniform(a=sqrt(5)), bound 1/sqrt(fan_in)
    assert float(w.abs().max()) <= 1 / math.sqrt(w[0].numel()) + 1e-6


def test_kaiming_init_refuses_pretrained() -> None:
    with pytest.raises(ValueError, match="discard pretrained"):
        create_backbone("resnet18", True, init="kaiming")


def test_backbone_init_reaches_the_module() -> None:
    from cloc_lightning.methods.supcon import SupConModule

    m = SupConModule(backbone="resnet18", cifar_stem=True, backbone_init="kaiming")
    assert all(torch.all(b.weight == 1) for b in m.backbone.modules() if isinstance(b, nn.BatchNorm2d))
