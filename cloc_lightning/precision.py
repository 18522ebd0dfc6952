"""The Trainer precisions a module cannot train in, refused when a fit is set up (with the reason and the fix).

Every module (CE, CLOC, SupCon/SimCLR, ReLIC, OrdinalCLIP, linear probe) trains under
``32-true``, ``64-true`` (float64 throughout: the losses keep float64 inputs in float64),
``bf16-mixed`` and ``bf16-true``, on CPU and GPU; ``16-mixed`` on a GPU (on a CPU Lightning
itself runs it as ``bf16-mixed``, with a warning).  Refused, by :func:`check_precision`
from ``BaseModule.setup('fit')``:

* ``16-true`` with an adaptive optimiser (``adam``, ``adamw``, ``radam``): the weights and the
  optimiser state are float16, where Adam's ``eps`` (1e-8) rounds to 0 and squared gradients
  below ~6e-8 vanish, so the first update divides by zero and every weight becomes NaN
  (measured: CE and CLOC with Adam are NaN from step 1).  With ``sgd`` it trains (no loss
  scaling: small gradients may still flush to zero).
* ``transformer-engine`` / ``transformer-engine-float16`` off an NVIDIA GPU: NVIDIA Transformer
  Engine's FP8 layers run on CUDA only (without the ``transformer_engine`` package Lightning
  refuses earlier, when the Trainer is built).
"""

from __future__ import annotations

from typing import Any

__all__ = ["ADAPTIVE_OPTIMIZERS", "precision_problem", "check_precision"]

#: optimiser names (``--model.optimizer``) that divide by ``sqrt(v) + eps``
ADAPTIVE_OPTIMIZERS = frozenset({"adam", "adamw", "radam"})


def precision_problem(precision: str, optimizer: str | None, device_type: str) -> str | None:
    """Why a fit at ``precision`` with ``optimizer`` on ``device_type`` cannot train, with the fix; ``None`` if it can.

    ``precision``: Lightning's precision string (``trainer.precision``, e.g. ``'16-true'``);
    ``optimizer``: the module's ``optimizer`` argument (``None``: unknown, e.g. a custom
    ``build_optimizer``); ``device_type``: ``'cpu'``, ``'cuda'``, ...
    """
    if precision == "16-true" and optimizer in ADAPTIVE_OPTIMIZERS:
        return (
            f"precision '16-true' keeps the weights and the {optimizer} state in float16, where the optimiser's eps "
            "(1e-8) rounds to 0 and squared gradients below ~6e-8 vanish: the first update divides by zero and every "
            "weight becomes NaN. Use --trainer.precision bf16-mixed or bf16-true (CPU or GPU) or 16-mixed (GPU), or "
            "--model.optimizer sgd to keep 16-true"
        )
    if precision.startswith("transformer-engine") and device_type != "cuda":
        return (
            f"precision {precision!r} runs NVIDIA Transformer Engine's FP8 layers, which need an NVIDIA GPU, but the "
            f"Trainer runs on {device_type!r}. Use --trainer.precision bf16-mixed (or 32-true) here, or "
            "--trainer.accelerator gpu on a machine with one"
        )
    return None


def check_precision(module: Any) -> None:
    """Raise a ``ValueError`` naming the reason and the fix when ``module``'s Trainer precision cannot train it.

    ``module``: a LightningModule attached to a Trainer (nothing is checked without one);
    its ``hparams.optimizer`` names the optimiser.  Reads host-side settings only.
    """
    trainer = getattr(module, "_trainer", None)
    if trainer is None:
        return
    hparams = getattr(module, "hparams", {})
    optimizer = hparams.get("optimizer") if hasattr(hparams, "get") else None
    device_type = trainer.strategy.root_device.type
    problem = precision_problem(str(trainer.precision), optimizer if isinstance(optimizer, str) else None, device_type)
    if problem is not None:
        raise ValueError(f"{type(module).__name__}: {problem}")
