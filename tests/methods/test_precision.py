"""Every module under every precision Lightning offers: a short real ``Trainer.fit`` on CPU, or a refusal at setup.

The matrix (docs/reliability.md, "Precisions"):

* ``32-true``, ``64-true``, ``bf16-mixed``, ``bf16-true``: every module trains (2 steps, finite losses and
  weights, the weights move).  ``64-true`` computes in float64 (the loss is float64), the others' loss is
  float32 (the losses upcast half inputs).  ReLIC trains with 16 px local crops: on test_resnet they reach
  1x1 maps, where PyTorch's CPU bf16 convolutions used to give NaN gradients (``HalfSafeConv2d``).
* ``16-mixed``: on a CPU Lightning runs it as ``bf16-mixed``; every module trains.
* ``16-true``: refused at setup for the adaptive optimisers (adam, adamw, radam: eps underflows in float16),
  naming the fix; the SGD modules (SupCon, SimCLR, linear probe, RnC, linear regressor; CE with ``optimizer: sgd``) train.
* ``transformer-engine`` / ``transformer-engine-float16``: refused -- by Lightning when the Trainer is built
  (the ``transformer_engine`` package is absent), else by the module's setup (no CUDA device).
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch

from cloc_lightning.data import MultiCropViews
from cloc_lightning.precision import ADAPTIVE_OPTIMIZERS, precision_problem
from tests._reliability import MODULES, _make, _shapes, _trainer

NAMES = list(MODULES)
TRAINS = ["32-true", "64-true", "bf16-mixed", "bf16-true", "16-mixed"]
#: the modules whose default optimiser is SGD: they train under 16-true
SGD_MODULES = {"SupConModule-supcon", "SupConModule-simclr", "LinearProbeModule", "RnCModule", "LinearRegressorModule"}


class _Record(L.Callback):
    """The training losses (value and dtype) and the precision the Trainer ran."""

    def __init__(self) -> None:
        self.losses: list[float] = []
        self.dtypes: list[torch.dtype] = []

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.losses.append(float(loss.detach()))
        self.dtypes.append(loss.dtype)


def _module(name: str, **kw: Any) -> tuple[L.LightningModule, L.LightningDataModule]:
    model, dm = _make(name, **kw)
    if name == "ReLICModule":  # 16 px local crops: 1x1 maps in test_resnet's last stages (see HalfSafeConv2d)
        dm = _shapes(4, views=MultiCropViews(num_global_views=2, num_local_views=1, local_size=16))
    return model, dm


def _fit(name: str, precision: str, tmp_path: Path, **kw: Any) -> tuple[L.LightningModule, L.Trainer, _Record]:
    model, dm = _module(name, **kw)
    record = _Record()
    trainer = _trainer(tmp_path, precision=precision, callbacks=[record], limit_train_batches=2, limit_val_batches=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, datamodule=dm)
    return model, trainer, record


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().float().clone() for k, v in model.named_parameters() if v.requires_grad}


#: the precisions every module trains under in the fast tier (the default and what GPU users run); the others
#: (64-true, bf16-true, 16-mixed: 16-mixed falls back to bf16-mixed on CPU) run in the long tier (``-m slow``)
FAST_PRECISIONS = ("32-true", "bf16-mixed")


@pytest.mark.parametrize(
    "name, precision",
    [pytest.param(n, p, marks=() if p in FAST_PRECISIONS else pytest.mark.slow) for n in NAMES for p in TRAINS],
)
def test_module_trains_under_precision(name: str, precision: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model, _ = _module(name)
    before = _weights(model)
    model, trainer, record = _fit(name, precision, tmp_path)
    assert trainer.global_step == 2 and len(record.losses) == 2
    assert all(math.isfinite(v) for v in record.losses), record.losses
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())
    after = _weights(model)
    assert any(not torch.equal(after[k], before[k]) for k in before)  # it trained
    expected = torch.float64 if precision == "64-true" else torch.float32
    assert set(record.dtypes) == {expected}, record.dtypes
    if precision == "64-true":  # the whole module in float64, the online/linear probe included
        assert {p.dtype for p in model.parameters() if p.is_floating_point()} == {torch.float64}
    if precision == "16-mixed":  # no fp16 autocast on CPU: Lightning runs bf16-mixed (with a warning)
        assert trainer.precision == "bf16-mixed"


@pytest.mark.parametrize("name", NAMES)
def test_16_true_trains_with_sgd_and_is_refused_with_adaptive_optimisers(name: str, tmp_path: Path) -> None:
    model, _ = _module(name)
    optimizer = model.hparams.get("optimizer")
    if name in SGD_MODULES:
        assert optimizer == "sgd"
        model, trainer, record = _fit(name, "16-true", tmp_path)
        assert trainer.global_step == 2 and all(math.isfinite(v) for v in record.losses)
        assert all(bool(torch.isfinite(p).all()) for p in model.parameters())
        return
    assert optimizer in ADAPTIVE_OPTIMIZERS
    with pytest.raises(
        ValueError,
        match=rf"{type(model).__name__}: precision '16-true' keeps .*{optimizer}.*eps.*"
        r"bf16-mixed or bf16-true.*--model.optimizer sgd",
    ):
        _fit(name, "16-true", tmp_path)


def test_16_true_with_sgd_trains_a_module_whose_default_is_adam(tmp_path: Path) -> None:
    model, trainer, record = _fit("CEModule", "16-true", tmp_path, optimizer="sgd")
    assert trainer.global_step == 2 and all(math.isfinite(v) for v in record.losses)
    assert {p.dtype for p in model.parameters()} == {torch.float16}


@pytest.mark.parametrize("precision", ["transformer-engine", "transformer-engine-float16"])
def test_transformer_engine_is_refused_on_cpu(precision: str, tmp_path: Path) -> None:
    try:
        trainer = _trainer(tmp_path, precision=precision)
    except ModuleNotFoundError as err:  # no transformer_engine package: Lightning refuses, naming the install
        assert "transformer_engine" in str(err)
        return
    model, dm = _module("CEModule")  # pragma: no cover - only where transformer_engine is installed
    with pytest.raises(ValueError, match="Transformer Engine.*NVIDIA GPU"):  # pragma: no cover
        trainer.fit(model, datamodule=dm)


def test_precision_problem_names_reason_and_fix() -> None:
    for optimizer in ("adam", "adamw", "radam"):
        text = precision_problem("16-true", optimizer, "cpu")
        assert text is not None and optimizer in text and "eps" in text and "bf16-mixed" in text
        assert precision_problem("16-true", optimizer, "cuda") is not None  # the same on a GPU
    assert precision_problem("16-true", "sgd", "cpu") is None
    assert precision_problem("16-true", None, "cpu") is None  # unknown optimiser (custom build_optimizer): not refused
    for precision in ("32-true", "64-true", "bf16-mixed", "bf16-true", "16-mixed"):
        assert precision_problem(precision, "adam", "cpu") is None
    text = precision_problem("transformer-engine", "adam", "cpu")
    assert text is not None and "NVIDIA GPU" in text and "bf16-mixed" in text
    assert precision_problem("transformer-engine-float16", "sgd", "cuda") is None
