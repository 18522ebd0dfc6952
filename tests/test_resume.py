"""Exact resume (``cloc_lightning/resume.py``): a fit stopped mid-epoch and resumed equals an uninterrupted one.

In process through ``trainer.fit(ckpt_path=...)`` (also from the stored fixture, ``tests/fixtures/``), and through
the CLI: a fit SIGKILLed and resumed with ``--ckpt_path last`` (*slow*).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import lightning as L
import pytest
import torch

from cloc_lightning.callbacks import CLOCMarginFreeze
from cloc_lightning.methods import CLOCModule, ReLICModule
from tests._reliability import (
    FIXTURE_CKPT,
    FIXTURE_OUTPUTS,
    RELIC_ARGS,
    SMALL,
    _all_finite,
    _cli_config,
    _fit_killed_at,
    _last_ckpt,
    _relic_views,
    _shapes,
    _trainer,
    assert_same,
    fit_stopped_and_resumed,
)
from tests.conftest import run_cli


@pytest.mark.slow
def test_cli_fit_killed_and_resumed_equals_an_uninterrupted_run(tmp_path: Path) -> None:
    """SIGKILL at the epoch 0/1 boundary (the margin freeze then happens in the resumed run) and mid-epoch 1
    (margins frozen, in their optimiser group without a gradient); each time resume with ``--ckpt_path last``.  The final checkpoint
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
    assert_same(
        resumed["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"],
        reference["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"],
        "batch_progress",
    )
    assert (resumed["global_step"], resumed["epoch"]) == (reference["global_step"], reference["epoch"])
    # the frozen margins keep their group (issue 41 item 6; it was removed at the freeze before)
    assert [g["name"] for g in resumed["optimizer_states"][0]["param_groups"]] == ["model", "margins"]


@pytest.mark.slow
def test_cli_relic_fit_killed_mid_epoch_and_resumed_equals_an_uninterrupted_run(tmp_path: Path) -> None:
    """ReLIC: online + EMA target (cosine beta), gamma schedule, learnable tau/b, cosine LR, multi-crop views.
    SIGKILL at step 5 (mid-epoch 1), resume with ``--ckpt_path last``: the final checkpoint equals the
    uninterrupted run's (target encoder/projector included) bit for bit."""
    run_cli(["fit", "--config", str(_cli_config(tmp_path, "reference", setup="relic"))], tmp_path, timeout=300)
    reference = torch.load(_last_ckpt(tmp_path / "runs" / "reference"), map_location="cpu", weights_only=False)
    assert reference["global_step"] == 8
    _fit_killed_at(tmp_path, "chain", 5, resume=True, setup="relic")
    final = run_cli(["fit", "--config", str(_cli_config(tmp_path, "chain", setup="relic")), "--ckpt_path", "last"], tmp_path, timeout=300)
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

    def build() -> tuple[L.LightningModule, L.LightningDataModule]:
        if method == "cloc":
            return CLOCModule(num_classes=4, **SMALL, margin_lr=0.05), _shapes(augment="crop_flip", batch_size=16)
        model = ReLICModule(num_classes=4, task="ordinal", mini_batch_size=8, **RELIC_ARGS, **SMALL)
        return model, _shapes(views=_relic_views(), batch_size=16)

    full, resumed = fit_stopped_and_resumed(tmp_path, build)  # 2 steps per epoch: step 3 is in the middle of epoch 1
    assert_same(resumed.state_dict(), full.state_dict(), "state_dict")


def test_resume_in_process_is_exact_after_the_margin_freeze(tmp_path: Path) -> None:
    """Issue 41 item 6: the frozen margins stay in their optimiser group (AdamW, weight decay on the margins).
    Stopped mid-epoch 1, after the freeze, and resumed: weights, margins, optimiser state (the margins' frozen state
    included), schedule and phase record equal one fit's bit for bit."""

    def build() -> tuple[L.LightningModule, L.LightningDataModule]:
        model = CLOCModule(num_classes=4, **SMALL, optimizer="adamw", margin_lr=0.05, margin_weight_decay=0.1)
        return model, _shapes(augment="crop_flip", batch_size=16)

    def freeze() -> list[L.Callback]:
        return [CLOCMarginFreeze(freeze_at_epoch=1, filename="m.yaml")]

    full, resumed = fit_stopped_and_resumed(tmp_path, build, max_epochs=3, callbacks=freeze)  # 2 steps per epoch
    assert resumed.margins_frozen and resumed.cloc_loss.frozen_at == {"epoch": 1, "step": 2}
    assert_same(resumed.state_dict(), full.state_dict(), "state_dict")
    ends = [torch.load(tmp_path / run / "last.ckpt", map_location="cpu", weights_only=False) for run in ("full", "part")]
    assert [g["name"] for g in ends[1]["optimizer_states"][0]["param_groups"]] == ["model", "margins"]
    assert ends[1]["cloc"]["margins_in_optimizer"] is True
    for key in ("optimizer_states", "lr_schedulers", "cloc"):
        assert_same(ends[1][key], ends[0][key], key)


def test_stored_fixture_resumes_training(tmp_path: Path) -> None:
    """Not only the weights: optimiser, schedule, loops and callback states of the stored checkpoint resume."""
    stored = torch.load(FIXTURE_OUTPUTS, map_location="cpu", weights_only=False)
    model = CLOCModule(num_classes=4, **SMALL, margin_lr=0.05)
    trainer = _trainer(
        tmp_path,
        max_epochs=3,
        limit_train_batches=None,
        limit_val_batches=0,
        callbacks=[CLOCMarginFreeze(freeze_at_epoch=1, filename="m.yaml")],
    )
    dm = _shapes(train_size=32, val_size=16, test_size=16, batch_size=16)  # the fixture's data: 2 steps per epoch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, datamodule=dm, ckpt_path=str(FIXTURE_CKPT))
    assert trainer.global_step == 6  # 2 stored epochs + 1 more, 2 steps each
    assert model.margins_frozen and torch.equal(model.cloc_loss.margins().detach(), stored["margins"])
    assert _all_finite(model)
    # written after the freeze by a build that removed the margins from the optimiser: resumed without them,
    # and its checkpoints say so (they resume the same way)
    assert [g["name"] for g in trainer.optimizers[0].param_groups] == ["model"]
    trainer.save_checkpoint(str(tmp_path / "again.ckpt"))
    assert torch.load(tmp_path / "again.ckpt", weights_only=False)["cloc"]["margins_in_optimizer"] is False
