"""What Lightning's checkpoints lack for an exact resume: RNG states and the training loader's position.

Lightning's checkpoints hold weights, optimiser and scheduler states, loop progress and
callback states, but not the global random number generators: a run resumed with
``--ckpt_path`` draws other augmentations (and dropout masks) than the uninterrupted run
would have drawn from that step on.  Lightning also saves the state of a resumable
training loader, but does not restore it when ``configure_optimizers`` has already
loaded the training data (``trainer.estimated_stepping_batches``, which every module's
step-wise schedule uses), so a mid-epoch resume would restart the epoch's data order.
:class:`ResumeState` stores the torch (CPU and CUDA), NumPy and Python ``random``
states and the :class:`~cloc_lightning.data.base.ResumableDataLoader` position in every
checkpoint and puts them back just before training resumes.  Every
:class:`~cloc_lightning.methods.base.BaseModule` adds it (see ``configure_callbacks``).

Together with the data modules' epoch-seeded, resumable training loader
(:class:`~cloc_lightning.data.base.ResumableDataLoader`) this makes a fit killed at any
step and resumed from its last checkpoint end with the same weights as an uninterrupted
run, with or without loader workers: the training set seeds every sample's augmentation
from ``(data seed, epoch, sample index)`` alone
(:class:`~cloc_lightning.data.base.TransformedSubset`), so it does not matter which
worker process draws a sample, how many there are, or when they were started
(``tests/test_reliability.py`` checks it with ``num_workers: 0``,
``tests/test_exact_resume_workers.py`` with 2 workers).  Custom transforms must draw from
torch's generator (all torchvision v2 transforms do) for this to hold.
"""

from __future__ import annotations

import random
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback

__all__ = ["ResumeState", "collect_rng_states", "set_rng_states"]


def collect_rng_states() -> dict[str, Any]:
    """The global RNG states: ``torch`` (CPU), ``cuda`` (all devices, when initialised), ``numpy``, ``python``."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    states: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        # plain Python values: checkpoints stay loadable with torch.load(weights_only=True)
        "numpy": [str(kind), [int(k) for k in keys], int(pos), int(has_gauss), float(gauss)],
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    """Restore states from :func:`collect_rng_states` (CUDA only when the device count matches)."""
    if "torch" in states:
        torch.set_rng_state(torch.as_tensor(states["torch"], dtype=torch.uint8).cpu())
    if "numpy" in states:
        kind, keys, pos, has_gauss, gauss = states["numpy"]
        np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
    if "python" in states:
        python_state = states["python"]
        # (version, tuple of ints, gauss) -- tuples may come back as lists from some loaders
        random.setstate((python_state[0], tuple(python_state[1]), python_state[2]))
    cuda = states.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([torch.as_tensor(s, dtype=torch.uint8).cpu() for s in cuda])


def _stateful_loaders(loaders: Any) -> list[Any]:
    """The training loaders (possibly nested in lists/dicts) that have ``state_dict``/``load_state_dict``."""
    if isinstance(loaders, dict):
        return [x for v in loaders.values() for x in _stateful_loaders(v)]
    if isinstance(loaders, (list, tuple)):
        return [x for v in loaders for x in _stateful_loaders(v)]
    ok = callable(getattr(loaders, "state_dict", None)) and callable(getattr(loaders, "load_state_dict", None))
    return [loaders] if ok else []


class ResumeState(Callback):
    """Save the global RNG states and the training loader's position; restore both when a fit resumes.

    Captured when a checkpoint is written; restored at ``on_train_start`` of the resumed
    fit (after Lightning's sanity check), i.e. just before the next training batch is
    loaded, as in the uninterrupted run.  Loading a checkpoint for evaluation or with
    ``load_from_checkpoint`` never touches the generators.  Under DDP every rank restores
    rank 0's states (only rank 0 writes the checkpoint).
    """

    def __init__(self) -> None:
        self._pending: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"rng": collect_rng_states()}
        trainer = getattr(self, "_trainer_ref", None)
        if trainer is not None and trainer.state.fn == "fit" and trainer.train_dataloader is not None:
            state["train_loaders"] = [loader.state_dict() for loader in _stateful_loaders(trainer.train_dataloader)]
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending = dict(state_dict)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._trainer_ref = trainer

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        saved = pending.get("train_loaders") or []
        loaders = _stateful_loaders(trainer.train_dataloader)
        if len(saved) == len(loaders):
            for loader, state in zip(loaders, saved):
                loader.load_state_dict(state)  # idempotent if Lightning has already done it
        if pending.get("rng") is not None:
            set_rng_states(pending["rng"])
