"""Helpers of the bad-input and fault tests (docs/reliability.md): every module built small, small data, fits, kill
and resume, the stored fixture's paths.

The table in docs/reliability.md "input / fault -> what happens" has one test (or parametrised test) per row, each
beside the component it exercises (``tests/<package>/test_<package>_errors.py`` for what a whole package checks
alike, the module's own test file otherwise); the kill/resume helpers serve ``tests/test_resume.py`` and
``tests/data/test_exact_resume_workers.py`` too.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
import yaml
from PIL import Image

from cloc_lightning.data import (
    MultiCropViews,
    OrdinalShapesDataModule,
    SupConViews,
)
from cloc_lightning.data.transforms import ViewTransform
from cloc_lightning.methods import (
    CEModule,
    CLOCModule,
    LinearProbeModule,
    LinearRegressorModule,
    OrdinalCLIPModule,
    OrdinalRegressionModule,
    ReLICModule,
    RnCModule,
    SupConModule,
)
from tests.conftest import TINY_BACKBONE, cli_env, cpu_trainer

FIXTURES = Path(__file__).resolve().parent / "fixtures"
FIXTURE_CKPT = FIXTURES / "cloc_tiny.ckpt"
FIXTURE_OUTPUTS = FIXTURES / "cloc_tiny_outputs.pt"
#: a ~20k-parameter ResNet (the fixture's): fast fits and small checkpoints
SMALL = {"backbone": TINY_BACKBONE, "backbone_kwargs": {"channels": [8, 8, 16, 16], "stem_width": 4}}
TINY_CLIP = {
    "embed_dim": 24,
    "vision_cfg": {"layers": 1, "width": 32, "head_width": 16, "patch_size": 8, "image_size": 16},
    "text_cfg": {"context_length": 24, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
}


# =============================================================================================
# helpers and independent references
# =============================================================================================
def _shapes(num_classes: int = 4, views: int | ViewTransform | None = None, image_size: int = 32, **kw: Any) -> OrdinalShapesDataModule:
    args: dict[str, Any] = dict(
        num_classes=num_classes,
        train_size=32,
        val_size=8,
        test_size=8,
        batch_size=8,
        num_workers=0,
        image_size=image_size,
        augment="none",
    )
    if views:
        args["train_views"] = SupConViews(n_views=views) if isinstance(views, int) else views
    args.update(kw)
    return OrdinalShapesDataModule(**args)


_trainer = partial(
    cpu_trainer,
    max_epochs=1,
    enable_checkpointing=False,
    limit_train_batches=3,
    limit_val_batches=1,
    num_sanity_val_steps=0,
)


def _fit(model: L.LightningModule, dm: L.LightningDataModule, tmp_path: Path, **kw: Any) -> L.Trainer:
    trainer = _trainer(tmp_path, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, datamodule=dm)
    return trainer


#: ReLIC, small: 2 global + 1 local view, a 32-16 projector, gamma schedule, no kNN monitor
RELIC_ARGS: dict[str, Any] = dict(
    num_global_views=2,
    num_local_views=1,
    projector_hidden_dim=32,
    projector_dim=16,
    use_gamma_scaling=True,
    gamma_scaling_steps=6,
    knn_k=0,
    lr=1e-3,
)


def _relic_views() -> MultiCropViews:
    # local crops of 24 px: 16 px crops reach layer4 as 1x1 maps, where PyTorch's CPU bf16 convolution backward
    # sporadically returns NaN gradients for the padding-only taps (see test_non_finite_gradients_...)
    return MultiCropViews(num_global_views=2, num_local_views=1, local_size=24)


#: every module, built small; ``views``: the data module's ``train_views``; ``size``: image size
MODULES: dict[str, tuple[Callable[..., L.LightningModule], Any, int]] = {
    "CEModule": (lambda n=4, **kw: CEModule(num_classes=n, **SMALL, **kw), None, 32),
    "CLOCModule": (lambda n=4, **kw: CLOCModule(num_classes=n, **SMALL, **kw), None, 32),
    "SupConModule-supcon": (
        lambda n=4, **kw: SupConModule(method="supcon", temperature=0.05, num_classes=n, task="ordinal", **SMALL, **kw),
        2,
        32,
    ),
    "SupConModule-simclr": (
        lambda n=4, **kw: SupConModule(method="simclr", temperature=0.05, num_classes=n, task="ordinal", **SMALL, **kw),
        2,
        32,
    ),
    "LinearProbeModule": (lambda n=4, **kw: LinearProbeModule(num_classes=n, encoder_ckpt=str(FIXTURE_CKPT), **kw), None, 32),
    "OrdinalCLIPModule": (
        lambda n=4, **kw: OrdinalCLIPModule(num_classes=n, clip_model="ViT-S-32-alt", clip_config=TINY_CLIP, num_context_tokens=4, **kw),
        None,
        16,
    ),
    "ReLICModule": (lambda n=4, **kw: ReLICModule(num_classes=n, task="ordinal", **RELIC_ARGS, **SMALL, **kw), "relic", 32),
    "RnCModule": (lambda n=4, **kw: RnCModule(lr=0.05, num_classes=n, task="ordinal", **SMALL, **kw), 2, 32),
    "LinearRegressorModule": (lambda n=4, **kw: LinearRegressorModule(num_classes=n, encoder_ckpt=str(FIXTURE_CKPT), **kw), None, 32),
    "OrdinalRegressionModule-corn": (lambda n=4, **kw: OrdinalRegressionModule(num_classes=n, head="corn", **SMALL, **kw), None, 32),
    "OrdinalRegressionModule-coral": (lambda n=4, **kw: OrdinalRegressionModule(num_classes=n, head="coral", **SMALL, **kw), None, 32),
}


def _make(name: str, n: int = 4, **kw: Any) -> tuple[L.LightningModule, OrdinalShapesDataModule]:
    build, views, size = MODULES[name]
    torch.manual_seed(0)
    return build(n, **kw), _shapes(4, views=_relic_views() if views == "relic" else views, image_size=size)


def _jpeg(path: Path, seed: int = 0, size: int = 20) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    arr = np.random.default_rng(seed).integers(0, 255, (size, size, 3), dtype=np.uint8)
    Image.fromarray(arr).save(path)


def _folder(root: Path, n: int = 6) -> Path:
    for split in ("train", "test"):
        for c in ("a", "b"):
            for i in range(n):
                _jpeg(root / split / c / f"{c}{i}.jpg", seed=i)
    return root


def _all_finite(module: torch.nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in module.parameters())


def _tiny_cli_config(model_args: dict[str, Any]) -> dict[str, Any]:
    """A CLOC config that finishes in seconds should it (wrongly) train."""
    return {
        "model": {"class_path": "cloc_lightning.methods.CLOCModule", "init_args": {"num_classes": 4, **SMALL, **model_args}},
        "data": {
            "class_path": "cloc_lightning.data.OrdinalShapesDataModule",
            "init_args": {"num_classes": 4, "train_size": 16, "val_size": 8, "test_size": 8, "batch_size": 8, "num_workers": 0},
        },
        "trainer": {"fast_dev_run": True, "logger": False, "enable_progress_bar": False},
    }


# =============================================================================================
# faults
# =============================================================================================
#: model + data of the kill/resume runs: 4 steps per epoch, random augmentation
RESUME_SETUPS: dict[str, dict[str, Any]] = {
    # CLOC: 3 epochs, margins learned in epoch 0 and frozen from epoch 1 (CLOCMarginFreeze)
    "cloc": {
        "max_epochs": 3,
        "callbacks": [{"class_path": "cloc_lightning.callbacks.CLOCMarginFreeze", "init_args": {"freeze_at_epoch": 1}}],
        "model": {
            "class_path": "cloc_lightning.methods.CLOCModule",
            "init_args": {"num_classes": 4, **SMALL, "margin_lr": 0.05, "lr": 0.003},
        },
        "data": {"augment": "crop_flip"},
    },
    # ReLIC: 2 epochs, EMA target from step 2 on (cosine beta), gamma decaying over 6 steps, cosine LR, multi-crop
    "relic": {
        "max_epochs": 2,
        "callbacks": [],
        "model": {
            "class_path": "cloc_lightning.methods.ReLICModule",
            "init_args": {"num_classes": 4, "task": "ordinal", **RELIC_ARGS, **SMALL, "scheduler": "cosine"},
        },
        "data": {
            "train_size": 32,
            "val_size": 8,
            "batch_size": 8,
            "train_views": {
                "class_path": "cloc_lightning.data.MultiCropViews",
                "init_args": {"num_global_views": 2, "num_local_views": 1, "local_size": 24},
            },
        },
    },
}


def _cli_config(tmp_path: Path, name: str, extra_callbacks: list[dict] | None = None, setup: str = "cloc") -> Path:
    """A CLI fit of ``RESUME_SETUPS[setup]`` that writes ``last.ckpt`` after every training step."""
    spec = RESUME_SETUPS[setup]
    cfg = {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu",
            "devices": 1,
            "max_epochs": spec["max_epochs"],
            "deterministic": True,
            "log_every_n_steps": 1,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "logger": {"class_path": "lightning.pytorch.loggers.TensorBoardLogger", "init_args": {"save_dir": "runs", "name": name}},
            "callbacks": [
                *spec["callbacks"],
                {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint", "init_args": {"every_n_train_steps": 1, "save_last": True}},
                *(extra_callbacks or []),
            ],
        },
        "model": spec["model"],
        "data": {
            "class_path": "cloc_lightning.data.OrdinalShapesDataModule",
            "init_args": {
                "num_classes": 4,
                "train_size": 64,
                "val_size": 16,
                "test_size": 16,
                "batch_size": 16,
                "num_workers": 0,
                **spec["data"],
            },
        },
    }
    path = tmp_path / f"{name}_{len(extra_callbacks or [])}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def _fit_killed_at(tmp_path: Path, name: str, step: int, resume: bool, setup: str = "cloc") -> str:
    """Start a CLI fit, SIGKILL it at the start of training step ``step``; return its output."""
    marker = tmp_path / f"paused_at_{step}"
    cfg = _cli_config(
        tmp_path, name, [{"class_path": "tests._faults.PauseAtStep", "init_args": {"step": step, "marker": str(marker)}}], setup
    )
    args = [sys.executable, "-m", "cloc_lightning", "fit", "--config", str(cfg)] + (["--ckpt_path", "last"] if resume else [])
    with open(tmp_path / f"killed_at_{step}.log", "w+") as log:
        proc = subprocess.Popen(args, cwd=tmp_path, env=cli_env(), stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 240
            while not marker.exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise AssertionError(f"the run did not reach step {step} (rc={proc.returncode}):\n{log.read()[-4000:]}")
                time.sleep(0.1)
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(timeout=60) == -signal.SIGKILL
        finally:
            if proc.poll() is None:
                proc.kill()
        log.seek(0)
        return log.read()


def _last_ckpt(run_dir: Path) -> Path:
    found = sorted(run_dir.glob("version_*/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime)
    assert found, f"no last.ckpt under {run_dir}"
    return found[-1]


def assert_same(a: Any, b: Any, where: str = "checkpoint") -> None:
    """Exact equality of nested checkpoint contents (tensors bit for bit)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), f"{where} differs (max |diff| {float((a.double() - b.double()).abs().max()):.3g})"
    elif isinstance(a, dict):
        assert set(a) == set(b), f"{where}: keys {sorted(set(a) ^ set(b))}"
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def fit_stopped_and_resumed(
    tmp_path: Path,
    build: Callable[[], tuple[L.LightningModule, L.LightningDataModule]],
    stop_at_step: int = 3,
    max_epochs: int = 2,
    callbacks: Callable[[], list[L.Callback]] = list,
) -> tuple[L.LightningModule, L.LightningModule]:
    """``(uninterrupted, resumed)``: one fit of ``build()``, and one stopped at ``stop_at_step`` and resumed from its ``last.ckpt``.

    Checkpoints after every step (``<tmp_path>/full/last.ckpt``, ``<tmp_path>/part/last.ckpt``); every fit is seeded
    alike (``seed_everything(0)``) and deterministic, with fresh ``callbacks()`` besides.
    """
    import contextlib

    from lightning.pytorch.callbacks import ModelCheckpoint

    class Killed(Exception):
        pass

    class Stop(L.Callback):
        def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
            if trainer.global_step == stop_at_step:
                raise Killed

    def run(folder: str, ckpt: str | None = None, stop: bool = False) -> tuple[L.LightningModule, L.Trainer]:
        L.seed_everything(0, verbose=False)
        model, dm = build()
        used: list[L.Callback] = [ModelCheckpoint(dirpath=str(tmp_path / folder), every_n_train_steps=1, save_last=True), *callbacks()]
        if stop:
            used.append(Stop())
        trainer = _trainer(
            tmp_path,
            max_epochs=max_epochs,
            limit_train_batches=None,
            limit_val_batches=0,
            callbacks=used,
            enable_checkpointing=True,
            deterministic=True,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with contextlib.suppress(Killed):
                trainer.fit(model, datamodule=dm, ckpt_path=ckpt)
        return model, trainer

    full, full_trainer = run("full")
    _, stopped = run("part", stop=True)
    assert stopped.global_step == stop_at_step, f"the stopped fit reached step {stopped.global_step}, not {stop_at_step}"
    resumed, trainer = run("part", ckpt=str(tmp_path / "part" / "last.ckpt"))
    assert trainer.global_step == full_trainer.global_step > stop_at_step
    return full, resumed
