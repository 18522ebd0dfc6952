"""Reliability of checkpoints and resuming: exact in-process resume, the stored fixture (``tests/fixtures/make_fixtures.py``),
``map_location`` and strict loading.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch

from cloc_lightning.callbacks import CLOCMarginFreeze
from cloc_lightning.methods import CLOCModule, ReLICModule
from tests._reliability import (
    FIXTURE_CKPT,
    FIXTURE_OUTPUTS,
    FIXTURES,
    RELIC_ARGS,
    SMALL,
    _all_finite,
    _fit,
    _relic_views,
    _shapes,
    _trainer,
    assert_same,
)
from tests.conftest import cli_env


@pytest.mark.parametrize("method", ["cloc", "relic-mini-batches"])
def test_resume_in_process_is_exact_mid_epoch_with_random_augmentation(method: str, tmp_path: Path) -> None:
    """The Python API gets the same guarantee: stop after step 3 of 4 (mid-epoch 1), resume, compare to one fit.
    CLOC with learnable margins and random crops+flips; ReLIC with ``mini_batch_size`` (manual optimisation)."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    class Killed(Exception):
        pass

    class Stop(L.Callback):
        def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
            if trainer.global_step == 3:
                raise Killed

    def run(folder: str, ckpt: str | None = None, stop: bool = False) -> tuple[L.LightningModule, L.Trainer]:
        L.seed_everything(0, verbose=False)
        if method == "cloc":
            model: L.LightningModule = CLOCModule(num_classes=4, **SMALL, margin_lr=0.05)
            dm = _shapes(augment="crop_flip", batch_size=16)
        else:
            model = ReLICModule(num_classes=4, task="ordinal", mini_batch_size=8, **RELIC_ARGS, **SMALL)
            dm = _shapes(views=_relic_views(), batch_size=16)
        callbacks: list[L.Callback] = [ModelCheckpoint(dirpath=str(tmp_path / folder), every_n_train_steps=1, save_last=True)]
        if stop:
            callbacks.append(Stop())
        trainer = _trainer(tmp_path, max_epochs=2, limit_train_batches=None, limit_val_batches=0, callbacks=callbacks,
                           enable_checkpointing=True, deterministic=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with contextlib.suppress(Killed):
                trainer.fit(model, datamodule=dm, ckpt_path=ckpt)
        return model, trainer

    full, _ = run("full")
    _, stopped = run("part", stop=True)
    assert stopped.global_step == 3  # killed in the middle of epoch 1 (2 steps per epoch)
    resumed, trainer = run("part", ckpt=str(tmp_path / "part" / "last.ckpt"))
    assert trainer.global_step == 4
    assert_same(resumed.state_dict(), full.state_dict(), "state_dict")


def test_stored_fixture_loads_strictly_and_predicts_the_stored_outputs() -> None:
    """A checkpoint written by an earlier build (tests/fixtures/make_fixtures.py) keeps loading."""
    assert FIXTURE_CKPT.stat().st_size < 500 * 1024
    stored = torch.load(FIXTURE_OUTPUTS, map_location="cpu", weights_only=False)
    for location in ("cpu", torch.device("cpu"), {"cuda:0": "cpu"}, lambda storage, loc: storage):
        model = CLOCModule.load_from_checkpoint(str(FIXTURE_CKPT), map_location=location, strict=True, weights_only=False)
        model.eval()
        assert model.margins_frozen and not model.cloc_loss.learnables.requires_grad  # phase two state
        with torch.no_grad():
            torch.testing.assert_close(model(stored["images"]), stored["logits"], rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(model.embed(stored["images"]), stored["embedding"], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(model.cloc_loss.margins().detach(), stored["margins"])
        assert model.cloc_loss.to_learnable_map("fixed") == stored["learnable_map"]


def test_stored_fixture_resumes_training(tmp_path: Path) -> None:
    """Not only the weights: optimiser, schedule, loops and callback states of the stored checkpoint resume."""
    stored = torch.load(FIXTURE_OUTPUTS, map_location="cpu", weights_only=False)
    model = CLOCModule(num_classes=4, **SMALL, margin_lr=0.05)
    trainer = _trainer(tmp_path, max_epochs=3, limit_train_batches=None, limit_val_batches=0,
                       callbacks=[CLOCMarginFreeze(freeze_at_epoch=1, filename="m.yaml")])
    dm = _shapes(train_size=32, val_size=16, test_size=16, batch_size=16)  # the fixture's data: 2 steps per epoch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, datamodule=dm, ckpt_path=str(FIXTURE_CKPT))
    assert trainer.global_step == 6  # 2 stored epochs + 1 more, 2 steps each
    assert model.margins_frozen and torch.equal(model.cloc_loss.margins().detach(), stored["margins"])
    assert _all_finite(model)


def test_checkpoint_map_location_and_strict_loading(tmp_path: Path) -> None:
    """Save on CPU; load with map_location as str / torch.device / dict / callable; strict catches foreign keys;
    a float64 copy of the weights loads into the float32 module."""
    torch.manual_seed(0)
    model = CLOCModule(num_classes=4, **SMALL)
    trainer = _fit(model, _shapes(), tmp_path, limit_train_batches=2, limit_val_batches=0)
    path = tmp_path / "m.ckpt"
    trainer.save_checkpoint(str(path))
    model.eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = model(x)
    for location in ("cpu", torch.device("cpu"), {"cpu": "cpu"}, lambda storage, loc: storage):
        loaded = CLOCModule.load_from_checkpoint(str(path), map_location=location, strict=True, weights_only=False).eval()
        assert all(p.device.type == "cpu" for p in loaded.parameters())
        with torch.no_grad():
            torch.testing.assert_close(loaded(x), expected, rtol=0, atol=0)
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    ckpt["state_dict"] = {k: v.double() if v.is_floating_point() else v for k, v in ckpt["state_dict"].items()}
    torch.save(ckpt, tmp_path / "f64.ckpt")
    loaded = CLOCModule.load_from_checkpoint(str(tmp_path / "f64.ckpt"), map_location="cpu", strict=True, weights_only=False)
    assert all(p.dtype == torch.float32 for p in loaded.parameters())
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(x), expected)
    ckpt["state_dict"]["extra.weight"] = torch.zeros(1)
    torch.save(ckpt, tmp_path / "extra.ckpt")
    with pytest.raises(RuntimeError, match="Unexpected key.*extra.weight"):
        CLOCModule.load_from_checkpoint(str(tmp_path / "extra.ckpt"), strict=True, weights_only=False)
    with pytest.warns(UserWarning, match="not in the model state dict.*extra.weight"):  # strict=False: named, not fatal
        CLOCModule.load_from_checkpoint(str(tmp_path / "extra.ckpt"), strict=False, weights_only=False)


@pytest.mark.slow
def test_fixture_generator_regenerates_a_small_loadable_checkpoint(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(FIXTURES / "make_fixtures.py"), "--out", str(tmp_path)],
                          cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ckpt = tmp_path / FIXTURE_CKPT.name
    assert ckpt.stat().st_size < 500 * 1024 and sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [FIXTURE_CKPT.name, FIXTURE_OUTPUTS.name])
    model = CLOCModule.load_from_checkpoint(str(ckpt), map_location="cpu", strict=True, weights_only=False).eval()
    outputs = torch.load(tmp_path / FIXTURE_OUTPUTS.name, weights_only=False)
    with torch.no_grad():
        torch.testing.assert_close(model(outputs["images"]), outputs["logits"])
