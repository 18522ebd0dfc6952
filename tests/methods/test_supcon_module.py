"""SupConModule (SupCon / SimCLR pre-training), the online linear probe and the kNN helpers."""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cloc_lightning.checkpoints import ENCODER_META_KEY
from cloc_lightning.data import OrdinalShapesDataModule, SupConViews
from cloc_lightning.losses.supcon import SupConLoss
from cloc_lightning.methods import SupConModule
from cloc_lightning.nn.online_probe import OnlineLinearProbe, _metric_values, knn_accuracy, knn_predict
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
    for key in ("train/loss", "train/online_probe/loss", "train/online_probe/acc", "val/online_probe/acc",
                "val/online_probe/loss", "val/online_probe/mae", "val/online_probe/qwk"):  # ordinal data: ordinal metrics too
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


# ----------------------------------------------------------- online probe
def _batch_standardised(x: torch.Tensor, eps: float = 1e-5) -> np.ndarray:
    """Per-feature (x - batch mean) / sqrt(biased batch variance + eps), in float64 NumPy."""
    a = x.detach().double().numpy()
    return (a - a.mean(axis=0)) / np.sqrt(a.var(axis=0) + eps)


def test_online_probe_is_detached_and_skips_unlabelled() -> None:
    raw = OnlineLinearProbe(8, 3, task="nominal", norm=False)
    feats = torch.randn(6, 8, requires_grad=True)
    y = torch.tensor([0, 1, 2, -1, 1, -1])
    loss, logs = raw.training_step(feats, y)
    loss.backward()
    assert feats.grad is None and raw.classifier.weight.grad is not None and raw.norm is None
    keep = y >= 0
    expected = F.cross_entropy(feats.detach()[keep] @ raw.classifier.weight.detach().t() + raw.classifier.bias.detach(), y[keep])
    assert torch.allclose(loss, expected) and set(logs) == {"train/online_probe/loss", "train/online_probe/acc"}
    probe = OnlineLinearProbe(8, 3, task="nominal")  # normalised (the default): batch statistics over every row
    loss, _ = probe.training_step(feats, y)
    w, b = probe.classifier.weight.detach().double().numpy(), probe.classifier.bias.detach().double().numpy()
    expected = F.cross_entropy(torch.from_numpy(_batch_standardised(feats) @ w.T + b)[keep], y[keep])
    assert torch.allclose(loss.double(), expected, atol=1e-6)
    zero, logs = probe.training_step(torch.randn(3, 8), torch.tensor([-1, -1, -1]))
    # no labelled row: a zero loss (still a graph), the accuracy undefined (NaN: a gap in the logs, never a 0)
    assert float(zero.detach()) == 0.0 and math.isnan(float(logs["train/online_probe/acc"]))
    with pytest.raises(ValueError, match="out of range for the online probe's 3 classes"):
        probe.training_step(torch.randn(2, 8), torch.tensor([0, 3]))
    with pytest.raises(ValueError, match=r"expects features \[B, 8\]"):
        probe.training_step(torch.randn(2, 5), torch.tensor([0, 1]))


def test_normalised_online_probe_does_not_depend_on_the_feature_scale() -> None:
    """The failure it fixes: SGD lr 0.1 on raw features with a large common offset (ResNet-like:
    mean ~1.2, std ~1.9 per dimension, norm ~37) overshoots; on normalised features it does not."""
    torch.manual_seed(0)
    dim, centres = 256, torch.randn(4, 256) * 0.1

    def sample(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.randint(0, 4, (n,))
        return 1.2 + 1.9 * (centres[y] + torch.randn(n, dim)), y

    feats, _ = sample(64)
    probe = OnlineLinearProbe(dim, 4, task="nominal")
    assert torch.allclose(probe(feats), probe(feats * 20.0), atol=1e-4)  # batch statistics: scale-free
    losses = {}
    for norm in (True, False):
        torch.manual_seed(1)
        p = OnlineLinearProbe(dim, 4, task="nominal", norm=norm)
        opt = torch.optim.SGD(p.parameters(), lr=0.1, momentum=0.9)
        for _ in range(300):
            f, y = sample(64)
            loss, _ = p.training_step(f, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        p.eval()
        f, y = sample(2000)
        losses[norm] = float(F.cross_entropy(p(f), y))
    assert losses[True] < 2.0 and losses[False] > 4.0, losses  # measured: 1.26 vs 6.06
    one = OnlineLinearProbe(dim, 4, task="nominal")  # a single row in training uses the running statistics
    assert one(feats[:1]).shape == (1, 4)


def test_checkpoint_with_or_without_probe_normalisation_says_how_to_load_it() -> None:
    plain = OnlineLinearProbe(8, 3, norm=False).state_dict()
    with pytest.raises(RuntimeError, match="trained without feature normalisation.*online_probe_norm=False"):
        OnlineLinearProbe(8, 3).load_state_dict(plain)
    OnlineLinearProbe(8, 3, norm=False).load_state_dict(plain)
    normed = OnlineLinearProbe(8, 3).state_dict()
    with pytest.raises(RuntimeError, match="trained with feature normalisation.*online_probe_norm=True"):
        OnlineLinearProbe(8, 3, norm=False).load_state_dict(normed)
    model = SupConModule(backbone=TINY_BACKBONE, num_classes=3, task="nominal", online_probe_norm=False)
    assert model.probe is not None and model.probe.norm is None and model.hparams.online_probe_norm is False
    with pytest.raises(TypeError, match="online_probe_norm must be True or False"):
        SupConModule(backbone=TINY_BACKBONE, num_classes=3, task="nominal", online_probe_norm="yes")


def test_online_probe_eval_metrics_match_hand_count() -> None:
    probe = OnlineLinearProbe(2, 6, task="nominal")
    with torch.no_grad():  # class scores = a hand-made table through an identity-like classifier
        probe.classifier.weight.zero_()
        probe.classifier.bias.zero_()
    feats = torch.zeros(4, 2)
    logits = torch.tensor([[5.0, 4, 3, 2, 1, 0], [0, 1, 2, 3, 4, 5], [0, 5, 4, 3, 2, 1], [1, 2, 3, 4, 5, 0]])
    probe.classifier.forward = lambda f: logits  # type: ignore[method-assign]
    y = torch.tensor([0, 0, 1, 5])  # top-1 right: rows 0, 2 -> 0.5; top-5: row 1 (rank 6) and row 3 (rank 6) miss
    vals = _metric_values(probe.eval_step(feats, y, "val"))
    assert vals["val/online_probe/acc"] == pytest.approx(0.5)
    assert vals["val/online_probe/acc_top5"] == pytest.approx(0.5)
    assert vals["val/online_probe/loss"] == pytest.approx(float(F.cross_entropy(logits, y)))
    ordinal = OnlineLinearProbe(4, 3, task="ordinal")
    assert {"test/online_probe/mae", "test/online_probe/qwk"} <= set(ordinal.metrics["test"].keys())
    group = probe.param_group(lr=0.3)
    assert group["lr"] == 0.3 and group["weight_decay"] == 0.0 and len(group["params"]) == 2


def _knn_loop(train_x, train_y, query, c, k, t):
    """Independent reference: per query, sort cosine similarities and add exp(s/t) per class."""
    out = []
    for q in query.tolist():
        qn = torch.tensor(q) / torch.tensor(q).norm()
        sims = [(float(qn @ (torch.tensor(r) / torch.tensor(r).norm())), int(lab)) for r, lab in zip(train_x.tolist(), train_y, strict=True)]
        sims.sort(key=lambda s: -s[0])
        scores = [0.0] * c
        for s, lab in sims[:k]:
            scores[lab] += math.exp(s / t)
        out.append(scores)
    return torch.tensor(out)


@pytest.mark.parametrize("k", [1, 3, 50])
def test_knn_predict_against_loop_reference(k: int) -> None:
    g = torch.Generator().manual_seed(k)
    train_x, train_y = torch.randn(30, 5, generator=g), torch.randint(0, 4, (30,), generator=g)
    query = torch.randn(7, 5, generator=g)
    got = knn_predict(train_x, train_y, query, num_classes=4, k=k, temperature=0.5, chunk_size=3)
    assert torch.allclose(got, _knn_loop(train_x, train_y, query, 4, min(k, 30), 0.5), rtol=1e-5)


def test_knn_accuracy_on_separable_clusters_and_errors() -> None:
    g = torch.Generator().manual_seed(0)
    centres = torch.eye(6) * 10
    train_y = torch.arange(60) % 6
    test_y = torch.arange(30) % 6
    train_x = centres[train_y] + torch.randn(60, 6, generator=g)
    test_x = centres[test_y] + torch.randn(30, 6, generator=g)
    acc = knn_accuracy(train_x, train_y, test_x, test_y, k=5)
    assert acc["top1"] == 1.0 and acc["top5"] == 1.0
    with pytest.raises(ValueError, match="negative"):
        knn_predict(train_x, torch.full((60,), -1), test_x)


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
