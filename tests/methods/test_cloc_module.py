"""CLOCModule, the two-phase callbacks and the phase-two path through the CLI."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
import yaml

from cloc_lightning.callbacks import CLOCMarginFreeze, CLOCMarginPlot
from cloc_lightning.losses.cloc import OrdinalContrastiveLoss_mm, OrdinalContrastiveLoss_sm
from cloc_lightning.losses.cloc_margins import load_learnable_map
from cloc_lightning.methods import CLOCModule
from tests.conftest import REPO, TINY_BACKBONE, logged_trainer, run_cli, tiny_shapes

_dm = tiny_shapes  # 4 classes, 64/32/32 images, batches of 16: 4 training steps per epoch


def _trainer(tmp_path: Path, callbacks=(), **kw) -> L.Trainer:
    return logged_trainer(tmp_path, **{"max_epochs": 2, "callbacks": list(callbacks), **kw})


def test_loss_choice_and_param_groups() -> None:
    m = CLOCModule(num_classes=4, backbone=TINY_BACKBONE, margin_lr=0.05, margin_weight_decay=0.0, lr=1e-3)
    assert isinstance(m.cloc_loss, OrdinalContrastiveLoss_mm)
    groups = {g["name"]: g for g in m.param_groups()}
    assert groups["margins"]["lr"] == 0.05 and groups["margins"]["params"][0] is m.cloc_loss.learnables
    assert all(p is not m.cloc_loss.learnables for p in groups["model"]["params"])
    sm = CLOCModule(num_classes=4, backbone=TINY_BACKBONE, margin_mode="sm", learnable_map=[["fixed", 0.3]])
    assert isinstance(sm.cloc_loss, OrdinalContrastiveLoss_sm)
    assert [g["name"] for g in sm.param_groups()] == ["model"]  # a fixed margin is not optimised
    feat = CLOCModule(num_classes=4, backbone=TINY_BACKBONE, cloc_on="features", projector_dim=16)
    x = torch.randn(3, 3, 32, 32)
    f = feat.backbone(x)
    assert feat.cloc_embedding(f, feat.head(f)).shape == (3, 16)


def test_training_step_is_ce_plus_weighted_cloc() -> None:
    torch.manual_seed(0)
    m = CLOCModule(num_classes=4, backbone=TINY_BACKBONE, loss_weight=0.5)
    m.eval()  # deterministic BN for recomputation
    x, y = torch.randn(8, 3, 32, 32), torch.tensor([0, 1, 2, 3, 0, 1, 2, 3])
    logits = m(x)
    expected = torch.nn.functional.cross_entropy(logits, y) + 0.5 * m.cloc_loss(logits, y)
    assert torch.allclose(m.training_step((x, y), 0), expected)


def test_training_step_logs_the_cloc_share_of_the_loss(monkeypatch) -> None:
    # issue 17: the share says whether the CLOC term acts at all (the official reduction keeps it ~1 %)
    torch.manual_seed(0)
    m = CLOCModule(num_classes=4, backbone=TINY_BACKBONE, loss_weight=0.5)
    m.eval()
    logged: dict[str, float] = {}
    monkeypatch.setattr(m, "log", lambda name, value, **kw: logged.__setitem__(name, float(value)))
    x, y = torch.randn(8, 3, 32, 32), torch.tensor([0, 1, 2, 3, 0, 1, 2, 3])
    logits = m(x)
    ce = torch.nn.functional.cross_entropy(logits, y).item()
    cloc = m.cloc_loss(logits, y).item()
    m.training_step((x, y), 0)
    assert logged["train/cloc_share"] == pytest.approx(0.5 * cloc / (ce + 0.5 * cloc), rel=1e-5)
    assert 0.0 < logged["train/cloc_share"] < 1.0


def test_freeze_mid_run_keeps_margins_and_writes_yaml(tmp_path: Path) -> None:
    m = CLOCModule(num_classes=4, backbone=TINY_BACKBONE, margin_lr=0.05, log_margins_every_n_steps=1)
    freeze, plot = CLOCMarginFreeze(freeze_at_epoch=1), CLOCMarginPlot(every_n_steps=1)
    trainer = _trainer(tmp_path, [freeze, plot], max_epochs=3)
    start = m.cloc_loss.margins().detach().clone()
    seen: list[torch.Tensor] = []

    class Watch(L.Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            seen.append(pl_module.cloc_loss.margins().detach().clone())

    trainer.callbacks.append(Watch())
    trainer.fit(m, datamodule=_dm())
    assert not torch.allclose(seen[0], start)  # phase one learned the margins
    assert torch.equal(seen[1], seen[2]) and torch.equal(seen[0], seen[1])  # frozen from epoch 1 on
    assert m.margins_frozen and not m.cloc_loss.learnables.requires_grad
    assert all(p is not m.cloc_loss.learnables for g in trainer.optimizers[0].param_groups for p in g["params"])
    assert len(trainer.optimizers[0].param_groups) == 1
    payload = yaml.safe_load(Path(freeze.path).read_text())
    assert payload["frozen_in_this_run"] and payload["margin_names"] == ["C0-C1", "C1-C2", "C2-C3"]
    assert [k for k, _ in payload["learnable_map"]] == ["fixed"] * 3
    assert torch.allclose(torch.tensor([v for _, v in payload["learnable_map"]]), seen[0], atol=1e-6)
    assert Path(plot.path).is_file() and plot.frozen_step == 4  # 4 steps per epoch
    # TensorBoard has the margin scalars and the custom layout
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(trainer.log_dir)).Reload()
    assert {"margins/C0-C1", "margins/C2-C3"} <= set(acc.Tags()["scalars"])
    assert "cloc/margins" in acc.Tags()["images"]


def test_resume_after_freeze_keeps_margins_fixed(tmp_path: Path) -> None:
    m = CLOCModule(num_classes=4, backbone=TINY_BACKBONE, margin_lr=0.05)
    trainer = _trainer(tmp_path, [CLOCMarginFreeze(freeze_at_epoch=1)], max_epochs=2)
    trainer.fit(m, datamodule=_dm())
    last = trainer.checkpoint_callback.last_model_path
    frozen = m.cloc_loss.margins().detach().clone()
    m2 = CLOCModule(num_classes=4, backbone=TINY_BACKBONE, margin_lr=0.05)  # fresh, learnable margins
    t2 = _trainer(tmp_path, [CLOCMarginFreeze(freeze_at_epoch=1)], max_epochs=4)
    t2.fit(m2, datamodule=_dm(), ckpt_path=last)
    assert m2.margins_frozen and torch.equal(m2.cloc_loss.margins().detach(), frozen)
    assert t2.global_step == 16


def test_final_margins_yaml_without_freeze_and_load_learnable_map(tmp_path: Path) -> None:
    m = CLOCModule(num_classes=4, backbone=TINY_BACKBONE)
    freeze = CLOCMarginFreeze()
    _trainer(tmp_path, [freeze], max_epochs=1).fit(m, datamodule=_dm())
    payload = yaml.safe_load(Path(freeze.path).read_text())
    assert not payload["frozen_in_this_run"]
    loaded = load_learnable_map(freeze.path)
    m2 = CLOCModule(num_classes=4, backbone=TINY_BACKBONE, learnable_map=freeze.path)
    assert m2.hparams.learnable_map == loaded  # resolved list stored, not the path
    assert torch.allclose(m2.cloc_loss.margins(), m.cloc_loss.margins().detach(), atol=1e-6)
    assert m2.margin_parameters() == []
    assert load_learnable_map("[[fixed, 0.5], [learnable, null]]") == [["fixed", 0.5], ["learnable", None]]
    with pytest.raises(FileNotFoundError, match="CLOCMarginFreeze"):
        load_learnable_map("no_such_margins.yaml")


class _FreezeThroughTheOwner(L.Callback):
    """Freezes the margins at the start of epoch 1 through their owner (the loss), not the module or CLOCMarginFreeze."""

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch == 1:
            pl_module.cloc_loss.freeze(epoch=trainer.current_epoch, step=trainer.global_step)


def test_a_freeze_through_the_owner_is_what_every_reader_reports(tmp_path: Path) -> None:
    """One record of the frozen state: the module, the loss, both callbacks and the checkpoint read the owner's."""
    m = CLOCModule(num_classes=4, backbone=TINY_BACKBONE, margin_lr=0.05)
    freeze, plot = CLOCMarginFreeze(), CLOCMarginPlot(every_n_steps=1)  # freeze_at_epoch=None: never freezes itself
    seen: list[torch.Tensor] = []

    class Watch(L.Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            seen.append(pl_module.cloc_loss.margins().detach().clone())

    trainer = _trainer(tmp_path, [_FreezeThroughTheOwner(), freeze, plot, Watch()], max_epochs=3)
    trainer.fit(m, datamodule=_dm())
    when = {"epoch": 1, "step": 4}  # 4 steps per epoch
    assert m.cloc_loss.frozen and m.cloc_loss.frozen_at == when and m.margins_frozen
    assert m.cloc_loss.margin_kinds() == ["fixed"] * 3 and m.margin_parameters() == []
    assert freeze.frozen_at == when and plot.frozen_step == 4
    assert freeze.path is None  # frozen: no final-margins YAML, as after a freeze by the callback
    assert torch.equal(seen[0], seen[1]) and torch.equal(seen[1], seen[2])  # nothing moved after the freeze
    assert [g["name"] for g in trainer.optimizers[0].param_groups] == ["model"]  # the optimiser dropped them
    last = trainer.checkpoint_callback.last_model_path
    ckpt = torch.load(last, weights_only=False)
    assert ckpt["cloc"]["margins_frozen"] and ckpt["cloc"]["frozen_at"] == when
    assert [k for k, _ in ckpt["cloc"]["learnable_map"]] == ["fixed"] * 3
    assert ckpt["callbacks"]["CLOCMarginFreeze"]["frozen_at"] == when
    assert ckpt["callbacks"]["CLOCMarginPlot"]["frozen_step"] == 4
    # and back: a loaded module and a resumed fit's callbacks report the same freeze
    loaded = CLOCModule.load_from_checkpoint(last)
    assert loaded.margins_frozen and loaded.cloc_loss.frozen_at == when
    m2 = CLOCModule(num_classes=4, backbone=TINY_BACKBONE, margin_lr=0.05)
    freeze2, plot2 = CLOCMarginFreeze(), CLOCMarginPlot(every_n_steps=1)
    t2 = _trainer(tmp_path, [freeze2, plot2], max_epochs=4)
    t2.fit(m2, datamodule=_dm(), ckpt_path=last)
    assert t2.global_step == 16 and m2.margins_frozen and torch.equal(m2.cloc_loss.margins().detach(), seen[-1])
    assert freeze2.frozen_at == when and plot2.frozen_step == 4


def test_checkpoints_from_before_the_record_tell_when_they_were_frozen() -> None:
    """The stored fixture's ``cloc`` entry has no ``frozen_at``: the callbacks' states it was written with say it."""
    from tests._reliability import FIXTURE_CKPT

    stored = torch.load(FIXTURE_CKPT, map_location="cpu", weights_only=False)
    assert "frozen_at" not in stored["cloc"]
    model = CLOCModule.load_from_checkpoint(str(FIXTURE_CKPT), map_location="cpu", weights_only=False)
    assert model.margins_frozen and model.cloc_loss.frozen_at == stored["callbacks"]["CLOCMarginFreeze"]["frozen_at"]


def test_the_margin_plot_keeps_the_logged_margins_at_the_module_cadence(tmp_path: Path) -> None:
    """One cadence: CLOCMarginPlot() records what the module logs, at log_margins_every_n_steps (and the end)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    m = CLOCModule(num_classes=4, backbone=TINY_BACKBONE, margin_lr=0.05, log_margins_every_n_steps=3)
    plot = CLOCMarginPlot()
    assert plot.every_n_steps is None
    trainer = _trainer(tmp_path, [plot], max_epochs=2)  # 8 steps
    trainer.fit(m, datamodule=_dm())
    assert plot.steps == [0, 3, 6, 8]
    acc = EventAccumulator(str(trainer.log_dir), size_guidance={"scalars": 0}).Reload()
    for i, name in enumerate(m.cloc_loss.margin_names()):
        logged = {e.step: e.value for e in acc.Scalars(f"margins/{name}")}
        assert [logged[s] for s in plot.steps[:-1]] == pytest.approx([v[i] for v in plot.values[:-1]], rel=0, abs=0)
    assert [e.step for e in acc.Scalars("margins/C0-C1")][:1] == [0]
    with pytest.raises(ValueError, match="log_margins_every_n_steps must be >= 0"):
        CLOCModule(num_classes=4, backbone=TINY_BACKBONE, log_margins_every_n_steps=-1)


def test_wrong_length_phase_two_map_is_an_error(tmp_path: Path) -> None:
    p = tmp_path / "m.yaml"
    p.write_text(yaml.safe_dump({"learnable_map": [["fixed", 0.5], ["fixed", 0.6]]}))
    with pytest.raises(ValueError, match="3|length|entries"):
        CLOCModule(num_classes=4, backbone=TINY_BACKBONE, learnable_map=str(p))


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="margin_mode"):
        CLOCModule(num_classes=4, backbone=TINY_BACKBONE, margin_mode="xx")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cloc_on"):
        CLOCModule(num_classes=4, backbone=TINY_BACKBONE, cloc_on="pixels")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="projector_dim only applies"):
        CLOCModule(num_classes=4, backbone=TINY_BACKBONE, projector_dim=8)
    with pytest.raises(TypeError, match="CLOCModule"):
        from cloc_lightning.methods import CEModule

        _trainer(Path("."), [CLOCMarginFreeze(1)], max_epochs=1, logger=False).fit(
            CEModule(num_classes=4, backbone=TINY_BACKBONE), datamodule=_dm()
        )


@pytest.mark.slow  # a CLI subprocess run: the long tier (pytest -m slow)
def test_two_phases_as_two_cli_runs(tmp_path: Path, tiny_shapes_args: list[str]) -> None:
    common = [*tiny_shapes_args, "--model.backbone", TINY_BACKBONE]
    out1 = run_cli(
        ["fit", "--config", str(REPO / "configs" / "cloc" / "demo.yaml"), "--model.num_classes", "4",
         "--trainer.callbacks.init_args.freeze_at_epoch", "null", *common, "--trainer.logger.init_args.name", "p1"],
        tmp_path,
    ).stdout
    run1 = tmp_path / "runs" / "p1" / "version_0"
    margins_yaml = run1 / "cloc_margins.yaml"
    assert margins_yaml.is_file() and "test/mae" in out1
    ckpt = next((run1 / "checkpoints").glob("best-*.ckpt"))
    out2 = run_cli(
        ["fit", "--config", str(REPO / "configs" / "cloc" / "demo_phase2.yaml"), "--model.num_classes", "4", *common,
         "--model.learnable_map", str(margins_yaml), "--model.init_from", str(ckpt),
         "--trainer.logger.init_args.name", "p2"],
        tmp_path,
    ).stdout
    assert "init_from" in out2 and "loaded" in out2 and "test/qwk" in out2
    ck2 = torch.load(next((tmp_path / "runs" / "p2" / "version_0" / "checkpoints").glob("last.ckpt")), weights_only=False)
    phase1 = yaml.safe_load(margins_yaml.read_text())["learnable_map"]
    assert ck2["hyper_parameters"]["learnable_map"] == phase1
    m2 = CLOCModule.load_from_checkpoint(str(tmp_path / "runs" / "p2" / "version_0" / "checkpoints" / "last.ckpt"))
    assert torch.allclose(m2.cloc_loss.margins(), torch.tensor([v for _, v in phase1]), atol=1e-6)


_USER_MODULE = '''
"""A user's own project: CLOC with their backbone, a projector and their optimiser."""
import torch
from torch import nn
from cloc_lightning.methods import CLOCModule


class MyNet(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, width, 3, stride=2, padding=1), nn.ReLU(),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.out_dim = width

    def forward(self, x):
        return self.net(x)


class MyCLOC(CLOCModule):
    def __init__(self, num_classes: int, width: int = 12, **kwargs):
        self.width = width
        super().__init__(num_classes=num_classes, **kwargs)

    def build_backbone(self):
        net = MyNet(self.width)
        return net, net.out_dim

    def build_projector(self):
        return nn.Linear(self.feature_dim, 5)

    def build_optimizer(self, groups):
        return torch.optim.SGD(groups, lr=self.hparams.lr, momentum=0.5)
'''


def test_user_subclass_in_own_project_through_the_cli(tmp_path: Path, tiny_shapes_args: list[str], monkeypatch) -> None:
    """A subclass in the user's own package is selectable with --model and keeps the CLOC machinery."""
    (tmp_path / "my_project.py").write_text(_USER_MODULE)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    run_cli(
        ["fit", "--model", "my_project.MyCLOC", "--model.num_classes", "4", "--model.width", "10",
         "--model.cloc_on", "features", "--model.lr", "0.01", *tiny_shapes_args,
         "--trainer.logger.init_args.name", "user", "--trainer.max_epochs", "2",
         "--trainer.callbacks+=cloc_lightning.callbacks.CLOCMarginFreeze", "--trainer.callbacks.freeze_at_epoch", "1"],
        cwd=tmp_path,
    )
    run = tmp_path / "runs" / "user" / "version_0"
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["hyper_parameters"]["width"] == 10
    assert ckpt["state_dict"]["backbone.net.0.weight"].shape[0] == 10
    assert ckpt["state_dict"]["projector.weight"].shape == (5, 10)
    assert all(g["momentum"] == 0.5 for g in ckpt["optimizer_states"][0]["param_groups"])  # the user's SGD
    margins = yaml.safe_load((run / "cloc_margins.yaml").read_text())
    assert margins["frozen_in_this_run"] is True and len(margins["learnable_map"]) == 3
    assert all(kind == "fixed" for kind, _ in margins["learnable_map"])
