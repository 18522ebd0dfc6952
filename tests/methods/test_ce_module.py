"""CE baseline, the shared base (schedules, checkpoints, metrics) and a user subclass."""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path

import pytest
import torch
from torch import nn

from cloc_lightning.methods import CEModule
from cloc_lightning.methods.optim import lr_factor
from tests.conftest import TINY_BACKBONE, cpu_trainer, tiny_shapes

_dm = tiny_shapes  # 4 classes, 64/32/32 images, batches of 16: 4 training steps per epoch


_trainer = partial(cpu_trainer, max_epochs=1)


def test_lr_factor_warmup_cosine_step() -> None:
    # 10 steps/epoch, 1 warm-up epoch, 100 steps
    assert lr_factor(0, 100, 10, "cosine", 1.0) == pytest.approx(0.1)
    assert lr_factor(9, 100, 10, "cosine", 1.0) == pytest.approx(1.0)
    assert lr_factor(10, 100, 10, "cosine", 1.0) == pytest.approx(1.0)
    assert lr_factor(55, 100, 10, "cosine", 1.0) == pytest.approx(0.5)
    assert lr_factor(100, 100, 10, "cosine", 1.0, min_lr_ratio=0.1) == pytest.approx(0.1)
    assert lr_factor(29, 100, 10, "step", 0.0, milestones=[3, 6], gamma=0.1) == pytest.approx(1.0)
    assert lr_factor(30, 100, 10, "step", 0.0, milestones=[3, 6], gamma=0.1) == pytest.approx(0.1)
    assert lr_factor(65, 100, 10, "step", 0.0, milestones=[3, 6], gamma=0.1) == pytest.approx(0.01)
    assert lr_factor(50, 100, 10, "none") == 1.0


def test_fit_test_predict_and_schedule(tmp_path: Path) -> None:
    model = CEModule(num_classes=4, backbone=TINY_BACKBONE, lr=1e-2, warmup_epochs=1.0, scheduler="cosine")
    dm = _dm()
    trainer = _trainer(tmp_path, max_epochs=2)
    trainer.fit(model, datamodule=dm)
    # 4 batches/epoch, 8 steps: warm-up over 4 steps, cosine to 0 at step 8
    assert trainer.global_step == 8
    lr = trainer.optimizers[0].param_groups[0]["lr"]
    assert lr == pytest.approx(1e-2 * lr_factor(8, 8, 4, "cosine", 1.0), abs=1e-9)
    metrics = trainer.test(model, datamodule=dm, verbose=False)[0]
    assert {"test/mae", "test/acc", "test/qwk", "test/acc_pm1", "test/mae_expected"} <= set(metrics)
    assert 0 <= metrics["test/acc"] <= 1 and metrics["test/mae"] >= 0
    preds = trainer.predict(model, datamodule=dm)
    p = preds[0]
    assert p["probs"].shape == (16, 4) and torch.allclose(p["probs"].sum(1), torch.ones(16))
    assert torch.equal(p["pred"], p["probs"].argmax(1))
    assert torch.allclose(p["expected"], p["probs"] @ torch.arange(4.0))


def test_best_checkpoint_monitors_val_mae(tmp_path: Path) -> None:
    model = CEModule(num_classes=4, backbone=TINY_BACKBONE)
    trainer = _trainer(tmp_path, max_epochs=2)
    trainer.fit(model, datamodule=_dm())
    ckpt = trainer.checkpoint_callback
    assert ckpt.monitor == "val/mae" and ckpt.mode == "min"
    assert Path(ckpt.best_model_path).is_file() and Path(ckpt.last_model_path).name == "last.ckpt"
    reloaded = CEModule.load_from_checkpoint(ckpt.best_model_path)
    assert reloaded.hparams.backbone == TINY_BACKBONE and reloaded.num_classes == 4


def test_nominal_task_uses_top1_and_monitors_accuracy() -> None:
    model = CEModule(num_classes=6, backbone=TINY_BACKBONE, task="nominal")
    assert model.monitor == "val/acc" and model.monitor_mode == "max"
    assert set(model.val_metrics.keys()) == {"val/acc", "val/acc_top5"}


def test_num_classes_mismatch_names_the_fix(tmp_path: Path) -> None:
    model = CEModule(num_classes=5, backbone=TINY_BACKBONE)
    with pytest.raises(ValueError, match=r"num_classes=5 but OrdinalShapesDataModule has 4 classes.*num_classes 4"):
        _trainer(tmp_path).fit(model, datamodule=_dm())


def test_multi_view_batches_are_refused(tmp_path: Path) -> None:
    from cloc_lightning.data import SupConViews

    model = CEModule(num_classes=4, backbone=TINY_BACKBONE)
    with pytest.raises(ValueError, match="remove data.train_views"):
        _trainer(tmp_path, limit_val_batches=0).fit(model, datamodule=_dm(train_views=SupConViews(2)))


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="num_classes must be an integer >= 2"):
        CEModule(num_classes=1, backbone=TINY_BACKBONE)
    with pytest.raises(ValueError, match="Unknown timm backbone 'resnet181'.*resnet18"):
        CEModule(num_classes=3, backbone="resnet181")
    with pytest.raises(ValueError, match="optimizer must be"):
        CEModule(num_classes=3, backbone=TINY_BACKBONE, optimizer="lion")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cifar_stem is supported for timm ResNet-family"):
        CEModule(num_classes=3, backbone="test_vit", cifar_stem=True)
    with pytest.raises(FileNotFoundError, match="pretrained: false"):
        CEModule(num_classes=3, backbone=TINY_BACKBONE, pretrained="/nonexistent/weights.pth")


def test_pretrained_unavailable_offline_fails_fast(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import time

    from huggingface_hub import constants

    from cloc_lightning.hub import PretrainedUnavailableError

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    t0 = time.perf_counter()
    with pytest.raises(PretrainedUnavailableError, match="pretrained: false.*local checkpoint"):
        CEModule(num_classes=3, backbone="resnet18", pretrained=True)
    assert time.perf_counter() - t0 < 20  # no minute of hub retries


def test_cifar_stem_keeps_resolution() -> None:
    m = CEModule(num_classes=3, backbone="resnet18", cifar_stem=True)
    assert isinstance(m.backbone.maxpool, nn.Identity) and m.backbone.conv1.stride == (1, 1)
    assert m(torch.zeros(2, 3, 32, 32)).shape == (2, 3)


class TinyCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.out_dim = 8

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class MyCE(CEModule):
    """What a user writes in their own project: own backbone, own head, own optimiser."""

    def __init__(self, num_classes: int, hidden: int = 16, **kwargs) -> None:
        self.hidden = hidden
        super().__init__(num_classes=num_classes, **kwargs)

    def build_backbone(self):
        net = TinyCNN()
        return net, net.out_dim

    def build_head(self) -> nn.Module:
        return nn.Sequential(nn.Linear(self.feature_dim, self.hidden), nn.ReLU(), nn.Linear(self.hidden, self.num_classes))

    def build_optimizer(self, groups):
        return torch.optim.SGD(groups, lr=0.05)


def test_user_subclass_trains_and_reloads(tmp_path: Path) -> None:
    model = MyCE(num_classes=4, hidden=12, scheduler="none")
    assert model.hparams.hidden == 12 and isinstance(model.backbone, TinyCNN)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = _trainer(tmp_path, max_epochs=1)
    trainer.fit(model, datamodule=_dm())
    assert isinstance(trainer.optimizers[0], torch.optim.SGD)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    reloaded = MyCE.load_from_checkpoint(trainer.checkpoint_callback.last_model_path)
    assert reloaded.head[0].out_features == 12
    x = torch.randn(3, 3, 32, 32)
    model.eval(), reloaded.eval()
    assert torch.allclose(model(x), reloaded(x))
    assert math.isfinite(trainer.callback_metrics["val/mae"].item())
