"""Exact resume: a fit killed at any step and resumed with ``--ckpt_path`` ends as the uninterrupted run.

Lightning's checkpoints hold weights, optimiser and scheduler states, loop progress and
callback states.  What they lack, and where this module puts it back:

* **the data order** -- a ``RandomSampler`` draws each epoch's order from the previous
  draws, so a resumed run (a fresh generator) would replay epoch 0's order.
  :class:`EpochShuffleSampler` draws epoch ``e``'s order from ``(seed, e)`` alone
  (:func:`epoch_seed`);
* **the position in the epoch** -- Lightning saves a resumable training loader's state but
  does not restore it when ``configure_optimizers`` has already loaded the training data
  (``trainer.estimated_stepping_batches``, which every step-wise schedule uses).
  :class:`ResumableDataLoader` saves ``{epoch, batches}`` and skips the batches already
  seen; :class:`ResumeState` restores it just before training resumes;
* **the augmentations** -- the training set draws sample ``i``'s augmentation in epoch ``e``
  from ``(seed, e, i)`` alone (:func:`sample_rng`, used by
  :class:`~cloc_lightning.data.datasets.TransformedSubset`), so it does not matter which loader
  worker draws a sample, how many workers there are, or when they were started;
* **the global generators** (torch CPU/CUDA, NumPy, Python ``random``: dropout masks and
  anything else drawn in the training step) -- :class:`ResumeState` stores them in every
  checkpoint (:func:`collect_rng_states`) and restores them at ``on_train_start`` of the
  resumed fit (:func:`set_rng_states`);
* **the schedule of an extended run** -- a finished run resumed with a larger
  ``--trainer.max_epochs`` (or ``max_steps``) restores the learning rate at which the old
  schedule ended (0.0 at a cosine's end); :class:`ResumeState` sets the rates of the
  schedule over the *new* total at the resumed step before the first step
  (:meth:`~cloc_lightning.methods.optim.ScheduleLR.continue_at_resumed_step`; the same
  values as the checkpoint's when the total is unchanged).

Under DDP each process's share of epoch ``e``'s order comes from :class:`DistributedEpochShuffleSampler`
(the same ``(seed, e)`` permutation, dealt out as Lightning's ``DistributedSampler`` does), so a
mid-epoch resume is exact there too.

Every :class:`~cloc_lightning.methods.base.BaseModule` adds :class:`ResumeState`
(``configure_callbacks``) and every data module builds its training loader from
:class:`ResumableDataLoader` and :class:`EpochShuffleSampler`.  ``tests/test_resume.py``
checks the whole chain with ``num_workers: 0``, ``tests/data/test_exact_resume_workers.py`` with
2 workers.  Custom transforms must draw from torch's generator (all torchvision v2
transforms do) for this to hold.
"""

from __future__ import annotations

import contextlib
import glob
import os
import random
import warnings
from collections.abc import Iterator
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

from cloc_lightning.checkpoints import read_checkpoint

__all__ = [
    "epoch_seed",
    "sample_seed",
    "sample_rng",
    "EpochShuffleSampler",
    "DistributedEpochShuffleSampler",
    "ResumableDataLoader",
    "collect_rng_states",
    "set_rng_states",
    "ResumeState",
    "find_last_checkpoint",
    "checkpoint_position",
    "checkpoint_progress",
]


# ----------------------------------------------------------------------------
# seeds that depend on (seed, epoch[, sample]) alone
# ----------------------------------------------------------------------------
def epoch_seed(seed: int, epoch: int) -> int:
    """A 63-bit generator seed that depends only on ``(seed, epoch)``."""
    return int(np.random.SeedSequence([int(seed) & (2**63 - 1), int(epoch)]).generate_state(1, np.uint64)[0] >> 1)


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """A 63-bit generator seed that depends only on ``(seed, epoch, index)`` (never equal to an epoch's seed)."""
    sequence = np.random.SeedSequence(int(seed) & (2**63 - 1), spawn_key=(int(epoch), int(index)))
    return int(sequence.generate_state(1, np.uint64)[0] >> 1)


@contextlib.contextmanager
def sample_rng(seed: int, epoch: int, index: int) -> Iterator[None]:
    """Within the block torch's CPU generator is seeded from ``(seed, epoch, index)``; afterwards it is as before.

    Only the CPU generator is forked and seeded (``torch.manual_seed`` would reseed CUDA
    too), so the calling process's global state is untouched.
    """
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(sample_seed(seed, epoch, index))
        yield


# ----------------------------------------------------------------------------
# the training loader
# ----------------------------------------------------------------------------
class EpochShuffleSampler(RandomSampler):
    """Random order of every epoch drawn from ``(seed, epoch)`` alone, so a resumed run sees the same batches.

    Epoch ``e`` always uses ``randperm(n, generator seeded from (seed, e))``; Lightning
    calls :meth:`set_epoch` at the start of every epoch (and the checkpointed epoch when
    resuming).  ``skip(n)`` drops the first ``n`` indices of the next pass only (mid-epoch
    resume, see :class:`ResumableDataLoader`).  Under DDP the data modules use
    :class:`DistributedEpochShuffleSampler` instead (Lightning would replace this
    ``RandomSampler`` by its own ``DistributedSampler``).
    """

    def __init__(self, data_source: Any, seed: int = 0) -> None:
        super().__init__(data_source)
        self.seed = int(seed)
        self.epoch = 0
        self._skip = 0

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s order from the next pass on (a pending skip belongs to its epoch only)."""
        if int(epoch) != self.epoch:
            self._skip = 0
        self.epoch = int(epoch)

    def skip(self, n: int) -> None:
        """Start the next pass at position ``n`` of the epoch's order."""
        self._skip = max(0, int(n))

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator()
        g.manual_seed(epoch_seed(self.seed, self.epoch))
        order = torch.randperm(len(self.data_source), generator=g).tolist()
        start, self._skip = self._skip, 0
        yield from order[start:]


class DistributedEpochShuffleSampler(DistributedSampler):  # type: ignore[type-arg]
    """:class:`EpochShuffleSampler` for one process of a distributed run: its share of epoch ``e``'s order.

    Epoch ``e``'s order of the whole set is ``randperm(n)`` seeded from ``(seed, e)``; as
    Lightning's ``DistributedSampler`` it is padded with its own first indices to a
    multiple of ``num_replicas`` (or cut to one, with ``drop_last``) and process ``r``
    takes positions ``r, r + W, ...``.  ``skip(n)`` drops the first ``n`` indices of this
    process's next pass only, so a fit killed in the middle of an epoch under DDP resumes
    with the next batch of that epoch on every process (:class:`ResumableDataLoader`),
    where Lightning's sampler would start the epoch over.  The data modules give it to
    their training loader when the trainer is distributed; Lightning keeps a loader whose
    sampler is already a ``DistributedSampler``.
    """

    def __init__(self, dataset: Any, num_replicas: int, rank: int, seed: int = 0, drop_last: bool = False) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=int(seed), drop_last=drop_last)
        self._skip = 0

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s order from the next pass on (a pending skip belongs to its epoch only)."""
        if int(epoch) != self.epoch:
            self._skip = 0
        super().set_epoch(int(epoch))

    def skip(self, n: int) -> None:
        """Start this process's next pass at position ``n`` of its share."""
        self._skip = max(0, int(n))

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator()
        g.manual_seed(epoch_seed(self.seed, self.epoch))
        order = torch.randperm(len(self.dataset), generator=g).tolist()  # type: ignore[arg-type]
        if self.drop_last:
            order = order[: self.total_size]
        else:
            while len(order) < self.total_size:  # pad with the order's own first indices (as DistributedSampler)
                order += order[: self.total_size - len(order)]
        share = order[self.rank : self.total_size : self.num_replicas]
        start, self._skip = self._skip, 0
        yield from share[start:]


class ResumableDataLoader(DataLoader[Any]):
    """The training ``DataLoader``: its epoch and position are saved in checkpoints and restored on resume.

    Implements Lightning's ``state_dict`` / ``load_state_dict`` protocol for data loaders:
    a checkpoint written after the ``k``-th batch of epoch ``e`` stores ``{epoch: e,
    batches: k}``; resuming from it continues with batch ``k + 1`` of epoch ``e``'s order
    (:class:`EpochShuffleSampler`), exactly as the uninterrupted run.  A checkpoint
    written at the end of an epoch stores ``{epoch: e + 1, batches: 0}``.  Iteration is lazy
    (workers start, and the sampler is read, at the first batch), so the epoch that
    Lightning sets just before the epoch starts is always the one used.  With another
    sampler (e.g. Lightning's ``DistributedSampler`` under DDP) the epoch is restored but
    a mid-epoch resume restarts that epoch's order (Lightning's behaviour); the data
    modules avoid that under DDP with :class:`DistributedEpochShuffleSampler`.

    At the start of every pass, before any index reaches a worker, the sampler's epoch is
    passed to the dataset's ``set_epoch`` (when it has one:
    :class:`~cloc_lightning.data.datasets.TransformedSubset` with a ``seed``), so the
    augmentations are epoch ``e``'s in every worker process as well; a sampler without an
    ``epoch`` attribute counts the passes instead.
    """

    def _position(self) -> int:
        return int(getattr(self, "_batches_done", 0))

    def _set_dataset_epoch(self) -> None:
        set_epoch = getattr(self.dataset, "set_epoch", None)
        if not callable(set_epoch):
            return
        epoch = getattr(self.sampler, "epoch", None)
        if epoch is None:
            epoch = self._passes = int(getattr(self, "_passes", -1)) + 1
        set_epoch(int(epoch))

    def __iter__(self) -> Any:
        # runs at the first batch (a generator): after Lightning's set_epoch / load_state_dict, before
        # DataLoader.__iter__ hands the epoch's first indices to the (persistent) workers
        self._set_dataset_epoch()
        resumed = int(getattr(self, "_resume_batches", 0))
        epoch = getattr(self.sampler, "epoch", None)
        if resumed and epoch is not None and int(epoch) != int(getattr(self, "_resume_epoch", epoch)):
            # the saved epoch had ended early (limit_train_batches: {epoch: e, batches: k < len}) and Lightning
            # started epoch e + 1 (set_epoch dropped the sampler's skip): its count starts at 0 too
            resumed = 0
        self._batches_done = resumed
        self._resume_batches = 0
        for batch in super().__iter__():
            self._batches_done += 1
            yield batch

    def state_dict(self) -> dict[str, Any]:
        """``{epoch, batches, batch_size}``: where the next batch of this loader is."""
        sampler = self.sampler
        epoch = int(getattr(sampler, "epoch", 0))
        done = self._position()
        if done >= len(self):
            epoch, done = epoch + 1, 0
        return {"epoch": epoch, "batches": done, "batch_size": self.batch_size}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`'s position at the next pass."""
        sampler = self.sampler
        epoch, done = int(state_dict.get("epoch", 0)), int(state_dict.get("batches", 0))
        set_epoch = getattr(sampler, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)
        if done and isinstance(sampler, (EpochShuffleSampler, DistributedEpochShuffleSampler)) and self.batch_size:
            sampler.skip(done * int(self.batch_size))
            self._resume_batches, self._resume_epoch = done, epoch
        elif done:
            warnings.warn(
                f"resuming mid-epoch with a {type(sampler).__name__}: epoch {epoch}'s data order restarts "
                "from its first batch (exact mid-epoch resume needs the data module's own shuffling sampler)",
                stacklevel=2,
            )


# ----------------------------------------------------------------------------
# the global generators and the callback that saves / restores everything
# ----------------------------------------------------------------------------
def collect_rng_states() -> dict[str, Any]:
    """The global RNG states: ``torch`` (CPU), ``cuda`` (all devices, when initialised), ``numpy``, ``python``."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    states: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        # plain Python values: checkpoints stay loadable with torch.load(weights_only=True)
        "numpy": [str(kind), [int(k) for k in keys], int(pos), int(has_gauss), float(gauss)],
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
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
        self._trainer_ref: L.Trainer | None = None

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"rng": collect_rng_states()}
        trainer = self._trainer_ref
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
        _start_next_epoch_anew(trainer)
        saved = pending.get("train_loaders") or []
        loaders = _stateful_loaders(trainer.train_dataloader)
        if len(saved) == len(loaders):
            for loader, state in zip(loaders, saved, strict=True):
                loader.load_state_dict(state)  # idempotent if Lightning has already done it
        if pending.get("rng") is not None:
            set_rng_states(pending["rng"])
        for config in trainer.lr_scheduler_configs:  # a run extended beyond its old total: the new total's rates
            continue_schedule = getattr(config.scheduler, "continue_at_resumed_step", None)
            if callable(continue_schedule):
                continue_schedule()


def _start_next_epoch_anew(trainer: L.Trainer) -> None:
    """After a checkpoint written at the end of an epoch's last batch, let Lightning start the next epoch as a new one.

    Lightning (2.x) resumes such a checkpoint as "restarted mid-epoch", counts the epoch as ended in
    ``FitLoop.reset``, but keeps that stage for the next epoch: it does not count the next epoch as
    started (``epoch_progress`` ready/started) and skips its ``on_train_epoch_start``.  A checkpoint
    written inside that epoch then resumes it from its first batch (``batch_idx`` 0): with
    ``limit_train_batches`` the epoch gets extra batches.  Called from ``on_train_start``, after
    ``FitLoop.reset`` and before the next epoch starts.
    """
    loop = getattr(trainer, "fit_loop", None)
    epoch_loop = getattr(loop, "epoch_loop", None)
    try:
        ended = (
            loop.restarted_mid_epoch  # type: ignore[union-attr]
            and epoch_loop.restarted_on_train_batch_end  # type: ignore[union-attr]
            and epoch_loop.batch_progress.is_last_batch  # type: ignore[union-attr]
            and loop.epoch_progress.total.processed == loop.epoch_progress.total.started  # type: ignore[union-attr]
        )
    except AttributeError:  # another Lightning: leave its loops alone
        return
    if ended:
        loop.reset_restart_stage()  # type: ignore[union-attr]


# ------------------------------------------------------------ which checkpoint
def find_last_checkpoint(trainer: Any) -> str | None:
    """The most recently written ``last*.ckpt`` of this run, in any of its logger versions.

    Lightning resolves ``ckpt_path="last"`` in the checkpoint folder of the *current*
    logger version only, and a new process starts a new version (``version_1``), so the
    previous run's ``last.ckpt`` would be missed and training would silently restart.
    Searched: the ``dirpath`` of configured ``ModelCheckpoint`` callbacks,
    ``<save_dir>/<name>/*/checkpoints`` of the first logger, and
    ``<default_root_dir>/checkpoints`` (no logger).
    """
    folders: list[str] = []
    for cb in getattr(trainer, "checkpoint_callbacks", []):
        if getattr(cb, "dirpath", None):
            folders.append(str(cb.dirpath))
    loggers = getattr(trainer, "loggers", [])
    if loggers:
        logger = loggers[0]
        save_dir = logger.save_dir if logger.save_dir is not None else trainer.default_root_dir
        name = logger.name if logger.name is not None else ""
        folders.extend(glob.glob(os.path.join(glob.escape(str(save_dir)), glob.escape(str(name)), "*", "checkpoints")))
    else:
        folders.append(os.path.join(trainer.default_root_dir, "checkpoints"))
    candidates = [f for d in folders for f in glob.glob(os.path.join(glob.escape(d), "last*.ckpt")) if os.path.isfile(f)]
    return max(candidates, key=os.path.getmtime) if candidates else None


def checkpoint_progress(path: str) -> tuple[int, int, bool]:
    """``(epochs finished, global step, mid-epoch)`` of a checkpoint: where a fit resumed from it starts.

    ``mid-epoch`` is ``True`` for a checkpoint written inside an epoch (the resumed fit
    continues that epoch, which is not counted as finished).
    """
    ckpt = read_checkpoint(path, mmap=True, what="checkpoint", hint="give an existing .ckpt file")
    epoch, step = int(ckpt.get("epoch") or 0), int(ckpt.get("global_step") or 0)
    try:
        loop = ckpt["loops"]["fit_loop"]
        finished = (
            bool(loop["epoch_loop.batch_progress"].get("is_last_batch")) or int(loop["epoch_progress"]["current"]["processed"]) > epoch
        )
    except (KeyError, TypeError, ValueError):
        return epoch, step, True  # no loop state: Lightning restarts epoch ``epoch``
    return (epoch + 1, step, False) if finished else (epoch, step, True)


def checkpoint_position(path: str) -> str:
    """Where a checkpoint stands: ``after epoch E, global step S`` (an epoch's end) or ``epoch E after batch B``."""
    ckpt = read_checkpoint(path, mmap=True, what="checkpoint", hint="give an existing .ckpt file")
    epoch, step = ckpt.get("epoch"), ckpt.get("global_step")
    try:
        loop = ckpt["loops"]["fit_loop"]
        # processed, not completed: Lightning counts a batch completed after its on_train_batch_end, where
        # ModelCheckpoint(every_n_train_steps) and the preemption checkpoint are written
        batches = int(loop["epoch_loop.batch_progress"]["current"]["processed"])
        finished = bool(loop["epoch_loop.batch_progress"].get("is_last_batch")) or int(
            loop["epoch_progress"]["current"]["processed"]
        ) > int(epoch or 0)
    except (KeyError, TypeError, ValueError):
        return f"epoch {epoch}, global step {step}"
    if finished:
        return f"after epoch {epoch}, global step {step}; training continues with epoch {int(epoch or 0) + 1}"
    return f"epoch {epoch} after batch {batches}, global step {step}; training continues with batch {batches + 1}"
