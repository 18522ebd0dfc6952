"""The CLOC callbacks: ``CLOCMarginFreeze`` (phase two: frozen margins, their YAML) and ``CLOCMarginPlot``, on
``CLOCModule`` fits in process (the module itself: ``tests/methods/test_cloc_module.py``)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
import yaml

from cloc_lightning.callbacks import CLOCMarginFreeze, CLOCMarginPlot
from cloc_lightning.losses.cloc_margins import load_learnable_map
from cloc_lightning.methods import CLOCModule
from tests.conftest import TINY_BACKBONE, logged_trainer, tiny_shapes

_dm = tiny_shapes  # 4 classes, 64/32/32 images, batches of 16: 4 training steps per epoch


_trainer = functools.partial(logged_trainer, max_epochs=2)


def test_freeze_mid_run_keeps_margins_and_writes_yaml(tmp_path: Path) -> None:
    m = CLOCModule(num_classes=4, backbone=TINY_BACKBONE, margin_lr=0.05, log_margins_every_n_steps=1)
    freeze, plot = CLOCMarginFreeze(freeze_at_epoch=1), CLOCMarginPlot(every_n_steps=1)
    trainer = _trainer(tmp_path, callbacks=[freeze, plot], max_epochs=3)
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
    # issue 41 item 6: the frozen margins stay in their optimiser group (they were removed from the optimiser before)
    groups = trainer.optimizers[0].param_groups
    assert [g["name"] for g in groups] == ["model", "margins"] and groups[1]["params"][0] is m.cloc_loss.learnables
    assert m.cloc_loss.learnables.grad is None
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
    trainer = _trainer(tmp_path, callbacks=[CLOCMarginFreeze(freeze_at_epoch=1)], max_epochs=2)
    trainer.fit(m, datamodule=_dm())
    last = trainer.checkpoint_callback.last_model_path
    frozen = m.cloc_loss.margins().detach().clone()
    m2 = CLOCModule(num_classes=4, backbone=TINY_BACKBONE, margin_lr=0.05)  # fresh, learnable margins
    t2 = _trainer(tmp_path, callbacks=[CLOCMarginFreeze(freeze_at_epoch=1)], max_epochs=4)
    t2.fit(m2, datamodule=_dm(), ckpt_path=last)
    assert m2.margins_frozen and torch.equal(m2.cloc_loss.margins().detach(), frozen)
    assert t2.global_step == 16


@pytest.fixture
def one_rank_process_group():
    """A one-process gloo group: ``is_distributed()`` is true, so the module's margin-gradient all-reduce runs."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("distributed", [False, True], ids=["one-process", "margin-all-reduce"])
def test_frozen_margins_keep_their_group_and_nothing_moves_them(distributed: bool, tmp_path: Path, request) -> None:
    """Issue 41 item 6: after the freeze the margins stay in their optimiser group with their state, and neither
    changes over 8 steps of AdamW with weight decay on the margins; also through ``on_after_backward``'s all-reduce
    (a zero-filled gradient there would move them through AdamW's momentum and decay)."""
    import copy

    import torch.distributed as dist

    if distributed:
        request.getfixturevalue("one_rank_process_group")
    m = CLOCModule(num_classes=4, backbone=TINY_BACKBONE, optimizer="adamw", margin_lr=0.05, margin_weight_decay=0.1)
    learnables = m.cloc_loss.learnables
    start = learnables.detach().clone()
    at_freeze: dict[str, Any] = {}
    grads_after_freeze: list[Any] = []

    class Watch(L.Callback):
        def on_train_epoch_start(self, trainer, pl_module):  # after CLOCMarginFreeze's (callback order)
            if trainer.current_epoch == 1:
                at_freeze["value"] = learnables.detach().clone()
                at_freeze["state"] = copy.deepcopy(trainer.optimizers[0].state.get(learnables))

        def on_before_optimizer_step(self, trainer, pl_module, optimizer):  # after backward and the all-reduce
            if pl_module.margins_frozen:
                grads_after_freeze.append(learnables.grad)

    trainer = _trainer(tmp_path, callbacks=[CLOCMarginFreeze(freeze_at_epoch=1), Watch()], max_epochs=3)
    trainer.fit(m, datamodule=_dm())
    assert dist.is_initialized() == distributed
    assert m.margins_frozen and not torch.equal(at_freeze["value"], start)  # phase one moved them
    groups = {g["name"]: g for g in trainer.optimizers[0].param_groups}
    assert list(groups) == ["model", "margins"]
    assert len(groups["margins"]["params"]) == 1 and groups["margins"]["params"][0] is learnables
    assert groups["margins"]["weight_decay"] == 0.1
    assert len(grads_after_freeze) == 8 and all(g is None for g in grads_after_freeze)  # epochs 1 and 2
    assert torch.equal(learnables.detach(), at_freeze["value"])
    state = trainer.optimizers[0].state[learnables]
    assert int(state["step"]) == 4  # phase one's 4 steps, none since
    assert set(state) == set(at_freeze["state"]) and all(torch.equal(state[k], at_freeze["state"][k]) for k in state)


def test_final_margins_yaml_without_freeze_and_load_learnable_map(tmp_path: Path) -> None:
    m = CLOCModule(num_classes=4, backbone=TINY_BACKBONE)
    freeze = CLOCMarginFreeze()
    _trainer(tmp_path, callbacks=[freeze], max_epochs=1).fit(m, datamodule=_dm())
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

    trainer = _trainer(tmp_path, callbacks=[_FreezeThroughTheOwner(), freeze, plot, Watch()], max_epochs=3)
    trainer.fit(m, datamodule=_dm())
    when = {"epoch": 1, "step": 4}  # 4 steps per epoch
    assert m.cloc_loss.frozen and m.cloc_loss.frozen_at == when and m.margins_frozen
    assert m.cloc_loss.margin_kinds() == ["fixed"] * 3 and m.margin_parameters() == []
    assert freeze.frozen_at == when and plot.frozen_step == 4
    assert freeze.path is None  # frozen: no final-margins YAML, as after a freeze by the callback
    assert torch.equal(seen[0], seen[1]) and torch.equal(seen[1], seen[2])  # nothing moved after the freeze
    # the optimiser keeps them in their group and skips them (issue 41 item 6; before, it dropped them)
    assert [g["name"] for g in trainer.optimizers[0].param_groups] == ["model", "margins"]
    last = trainer.checkpoint_callback.last_model_path
    ckpt = torch.load(last, weights_only=False)
    assert ckpt["cloc"]["margins_frozen"] and ckpt["cloc"]["frozen_at"] == when
    assert [k for k, _ in ckpt["cloc"]["learnable_map"]] == ["fixed"] * 3
    # the callbacks keep no copy of the record (issue 41 item 6; they did before)
    assert ckpt["callbacks"]["CLOCMarginFreeze"] == {"freeze_at_epoch": None}
    assert set(ckpt["callbacks"]["CLOCMarginPlot"]) == {"steps", "values"}
    # and back: a loaded module and a resumed fit's callbacks report the same freeze
    loaded = CLOCModule.load_from_checkpoint(last)
    assert loaded.margins_frozen and loaded.cloc_loss.frozen_at == when
    m2 = CLOCModule(num_classes=4, backbone=TINY_BACKBONE, margin_lr=0.05)
    freeze2, plot2 = CLOCMarginFreeze(), CLOCMarginPlot(every_n_steps=1)
    t2 = _trainer(tmp_path, callbacks=[freeze2, plot2], max_epochs=4)
    t2.fit(m2, datamodule=_dm(), ckpt_path=last)
    assert t2.global_step == 16 and m2.margins_frozen and torch.equal(m2.cloc_loss.margins().detach(), seen[-1])
    assert freeze2.frozen_at == when and plot2.frozen_step == 4


def test_the_margin_plot_keeps_the_logged_margins_at_the_module_cadence(tmp_path: Path) -> None:
    """One cadence: CLOCMarginPlot() records what the module logs, at log_margins_every_n_steps (and the end)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    m = CLOCModule(num_classes=4, backbone=TINY_BACKBONE, margin_lr=0.05, log_margins_every_n_steps=3)
    plot = CLOCMarginPlot()
    assert plot.every_n_steps is None
    trainer = _trainer(tmp_path, callbacks=[plot], max_epochs=2)  # 8 steps
    trainer.fit(m, datamodule=_dm())
    assert plot.steps == [0, 3, 6, 8]
    acc = EventAccumulator(str(trainer.log_dir), size_guidance={"scalars": 0}).Reload()
    for i, name in enumerate(m.cloc_loss.margin_names()):
        logged = {e.step: e.value for e in acc.Scalars(f"margins/{name}")}
        assert [logged[s] for s in plot.steps[:-1]] == pytest.approx([v[i] for v in plot.values[:-1]], rel=0, abs=0)
    assert [e.step for e in acc.Scalars("margins/C0-C1")][:1] == [0]
    with pytest.raises(ValueError, match="log_margins_every_n_steps must be >= 0"):
        CLOCModule(num_classes=4, backbone=TINY_BACKBONE, log_margins_every_n_steps=-1)
