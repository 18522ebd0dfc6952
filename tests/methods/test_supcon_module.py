"""SupConModule (SupCon / SimCLR pre-training); its online linear probe and kNN helpers: ``tests/nn/test_online_probe.py``."""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cloc_lightning.checkpoints import ENCODER_META_KEY
from cloc_lightning.data import OrdinalShapesDataModule, SupConViews
from cloc_lightning.losses.supcon import SupConLoss
from cloc_lightning.methods import SupConModule
from cloc_lightning.nn.online_probe import _metric_values
from tests.conftest import TINY_BACKBONE, cpu_trainer, tiny_shapes


def _dm(n_views: int | None = 2, **kw) -> OrdinalShapesDataModule:
    return tiny_shapes(train_views=SupConViews(n_views) if n_views else None, **kw)


_trainer = partial(cpu_trainer, max_epochs=1, log_every_n_steps=1)


@pytest.mark.parametrize("method", ["supcon", "simclr"])
def test_fit_logs_online_probe_and_checkpoints_on_it(tmp_path: Path, method: str) -> None:
    model = SupConModule(method=method, backbone=TINY_BACKBONE, lr=0.05, online_probe_lr=0.2)
    assert model.temperature == {"supcon": 0.1, "simclr": 0.5}[method]
    trainer = _trainer(tmp_path, max_epochs=2, limit_train_batches=3)
    trainer.fit(model, datamodule=_dm())
    m = trainer.callback_metrics
    for key in (
        "train/loss",
        "train/online_probe/loss",
        "train/online_probe/acc",
        "val/online_probe/acc",
        "val/online_probe/loss",
        "val/online_probe/mae",
        "val/online_probe/qwk",
    ):  # ordinal data: ordinal metrics too
        assert key in m and math.isfinite(float(m[key])), key
    assert 0.0 <= float(m["val/online_probe/acc"]) <= 1.0
    # the probe has its own group: no weight decay, its own lr (scaled by the same schedule)
    groups = {g["name"]: g for g in trainer.optimizers[0].param_groups}
    assert groups["online_probe"]["weight_decay"] == 0.0 and groups["model"]["weight_decay"] == 1e-4
    assert groups["online_probe"]["initial_lr"] == 0.2 and groups["model"]["initial_lr"] == 0.05
    assert isinstance(trainer.optimizers[0], torch.optim.SGD) and groups["model"]["momentum"] == 0.9
    ckpt = trainer.checkpoint_callback
    assert ckpt.monitor == "val/online_probe/acc" and ckpt.mode == "max" and Path(ckpt.best_model_path).is_file()
    final = tmp_path / "final.ckpt"  # (last.ckpt is only refreshed when the monitored metric improves)
    trainer.save_checkpoint(final)
    raw = torch.load(final, map_location="cpu", weights_only=False)
    assert raw[ENCODER_META_KEY]["prefix"] == "backbone." and raw[ENCODER_META_KEY]["backbone"] == TINY_BACKBONE
    # the probe's size is stored, so the checkpoint rebuilds it in __init__
    reloaded = SupConModule.load_from_checkpoint(final)
    assert reloaded.probe is not None and reloaded.probe.num_classes == 4 and reloaded.probe.task == "ordinal"
    x = torch.randn(3, 3, 32, 32)
    model.eval(), reloaded.eval()
    out, out2 = model(x), reloaded(x)
    assert out["features"].shape == (3, model.feature_dim) and out["projection"].shape == (3, 128)
    assert torch.allclose(out["projection"].norm(dim=1), torch.ones(3), atol=1e-5)
    assert torch.allclose(out["projection"], out2["projection"], atol=1e-6)
    test = trainer.test(model, datamodule=_dm(), verbose=False)[0]
    assert {"test/online_probe/acc", "test/online_probe/mae"} <= set(test)


def test_training_step_is_the_loss_on_normalised_projections_plus_probe_ce() -> None:
    torch.manual_seed(0)
    views = [torch.randn(6, 3, 32, 32), torch.randn(6, 3, 32, 32)]
    y = torch.tensor([0, 1, 2, 0, 1, -1])  # one unlabelled image
    for method in ("supcon", "simclr"):
        model = SupConModule(method=method, backbone=TINY_BACKBONE, num_classes=3, task="nominal", temperature=0.2)
        model.eval()  # BatchNorm with running statistics: the recomputation below sees the same network
        loss = model.training_step((views, y), 0)
        feats = model.backbone(torch.cat(views))
        z = F.normalize(model.projector.net(feats), dim=1)
        z = torch.stack([z[:6], z[6:]], dim=1)  # [bsz, n_views, dim]
        if method == "supcon":  # the unlabelled image is a class of its own: only its own views are positives
            expected = SupConLoss(temperature=0.2)(z, torch.tensor([0, 1, 2, 0, 1, 99]))
        else:
            expected = SupConLoss(temperature=0.2)(z)
        keep = (y >= 0).repeat(2)
        # the probe normalises with its running statistics in eval mode (fresh: mean 0, var 1)
        normed = feats[keep] / (1.0 + model.probe.norm.eps) ** 0.5
        probe = F.cross_entropy(model.probe.classifier(normed), y.repeat(2)[keep])
        assert torch.allclose(loss, expected + probe, atol=1e-5), method


def test_unlabelled_ids_are_unique_and_never_collide_with_classes() -> None:
    model = SupConModule(backbone=TINY_BACKBONE, online_probe=False)
    y = torch.tensor([3, -1, 0, -1, -1])
    out = model.contrastive_labels(y)
    assert out[[0, 2]].tolist() == [3, 0]
    unl = out[[1, 3, 4]]
    assert len(set(unl.tolist())) == 3 and bool((unl > 1000).all())
    assert model.contrastive_labels(torch.tensor([1, 2])).tolist() == [1, 2]
    assert SupConModule(method="simclr", backbone=TINY_BACKBONE, online_probe=False).contrastive_labels(y) is None


def test_views_mismatch_and_single_view_data_name_the_fix(tmp_path: Path) -> None:
    model = SupConModule(backbone=TINY_BACKBONE, n_views=2)
    with pytest.raises(ValueError, match=r"n_views=2\) got 3 view.*data.train_views.init_args.n_views: 2"):
        _trainer(tmp_path, limit_val_batches=0).fit(model, datamodule=_dm(3))
    with pytest.raises(ValueError, match="needs multi-view batches; set data.train_views"):
        _trainer(tmp_path, limit_val_batches=0).fit(SupConModule(backbone=TINY_BACKBONE), datamodule=_dm(None))
    # the same check on every batch (data that does not come from our data modules)
    batch = ([torch.randn(4, 3, 32, 32)] * 3, torch.tensor([0, 1, 0, 1]))
    with pytest.raises(ValueError, match="got 3 view"):
        SupConModule(backbone=TINY_BACKBONE, num_classes=2, task="nominal").training_step(batch, 0)


def test_bad_arguments_and_class_mismatch(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="method must be 'supcon' or 'simclr'"):
        SupConModule(method="moco", backbone=TINY_BACKBONE)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="simclr needs n_views >= 2"):
        SupConModule(method="simclr", n_views=1, backbone=TINY_BACKBONE)
    with pytest.raises(ValueError, match="temperature must be a positive"):
        SupConModule(temperature=-0.1, backbone=TINY_BACKBONE)
    with pytest.raises(ValueError, match="num_classes must be an integer >= 2"):
        SupConModule(num_classes=1, backbone=TINY_BACKBONE)
    with pytest.raises(ValueError, match=r"num_classes=5 but OrdinalShapesDataModule has 4 classes"):
        _trainer(tmp_path, limit_val_batches=0).fit(SupConModule(backbone=TINY_BACKBONE, num_classes=5), datamodule=_dm())


def test_without_probe_monitors_train_loss_and_trains(tmp_path: Path) -> None:
    model = SupConModule(backbone=TINY_BACKBONE, online_probe=False, scheduler="none", warmup_epochs=0)
    before = [p.detach().clone() for p in model.backbone.parameters()]
    trainer = _trainer(tmp_path, limit_train_batches=2, limit_val_batches=1)
    trainer.fit(model, datamodule=_dm())
    assert model.probe is None and trainer.checkpoint_callback.monitor == "train/loss"
    assert any(not torch.equal(a, b) for a, b in zip(before, model.backbone.parameters(), strict=True))
    with pytest.raises(ValueError, match="needs the online probe"):
        model.predict_step((torch.randn(2, 3, 32, 32), torch.tensor([0, 1])), 0)


def test_multi_view_validation_batches_log_the_contrastive_loss() -> None:
    model = SupConModule(backbone=TINY_BACKBONE, num_classes=3, task="nominal")
    model.eval()
    logged: dict[str, float] = {}
    model.log = lambda name, value, **kw: logged.update(_metric_values({name: value}))  # type: ignore[method-assign]
    model.log_dict = lambda d, **kw: logged.update(_metric_values(d))  # type: ignore[method-assign]
    with torch.no_grad():
        model.validation_step(([torch.randn(5, 3, 32, 32)] * 2, torch.tensor([0, 1, 2, 0, 1])), 0)
    assert math.isfinite(logged["val/loss"]) and "val/online_probe/acc" in logged


class NormalisedLinearProjector(nn.Module):
    def __init__(self, d: int, out: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.fc(x), dim=1)


class MySupCon(SupConModule):
    """A user's subclass: a linear projector of their own width."""

    def __init__(self, proj_out: int = 32, **kwargs) -> None:
        super().__init__(**kwargs)

    def build_projector(self) -> nn.Module:
        return NormalisedLinearProjector(self.feature_dim, self.hparams.proj_out)


def test_user_subclass_with_own_projector(tmp_path: Path) -> None:
    model = MySupCon(proj_out=24, backbone=TINY_BACKBONE, method="simclr")
    assert isinstance(model.projector, NormalisedLinearProjector)
    trainer = _trainer(tmp_path, limit_train_batches=2, limit_val_batches=2)
    trainer.fit(model, datamodule=_dm())
    assert math.isfinite(float(trainer.callback_metrics["train/loss"]))
    reloaded = MySupCon.load_from_checkpoint(trainer.checkpoint_callback.last_model_path)
    assert reloaded(torch.randn(2, 3, 32, 32))["projection"].shape == (2, 24)


def test_cli_sees_typed_arguments_of_both_modules() -> None:
    """What LightningCLI builds ``--model.help`` and YAML validation from (explicit args + the base's via **kwargs)."""
    from jsonargparse import ArgumentParser

    from cloc_lightning.methods import LinearProbeModule

    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(SupConModule, "supcon")
    parser.add_class_arguments(LinearProbeModule, "probe")
    d = parser.get_defaults()
    assert d.supcon.method == "supcon" and d.supcon.optimizer == "sgd" and d.supcon.lr == 0.05
    assert d.supcon.weight_decay == 1e-4 and d.supcon.projector_dim == 128 and d.supcon.n_views == 2
    assert "init_from" in d.supcon and "nesterov" in d.supcon  # forwarded to BaseModule
    assert d.probe.encoder_ckpt is None and d.probe.weight_decay == 0.0 and "lr_milestones" in d.probe and "task" in d.probe
    with pytest.raises(Exception, match="method"):
        parser.parse_args(["--supcon.method", "moco"])
