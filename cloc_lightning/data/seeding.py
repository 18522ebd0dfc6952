"""The data's seed and the run's record of its data (a mixin of :class:`~cloc_lightning.data.base.BaseDataModule`).

``data.seed`` decides the training order and every training augmentation (:mod:`cloc_lightning.resume`).
Unset (``null``, the default) it follows the run's seed: Lightning's ``seed_everything`` (and LightningCLI's
``--seed_everything``, ``true`` included, which picks one at random) leaves it in ``PL_GLOBAL_SEED``, read at
setup; under DDP rank 0's value is broadcast, so processes started by ``torchrun`` that each drew a random
seed still agree.  A run with no seed at all uses 0.  The seed used is kept in the checkpoint
(``state_dict()['data_seed']``) and restored by a resumed fit, so the resumed run draws the same order
and views as the uninterrupted one even when its own seed would differ; an explicit ``data.seed`` wins,
with a warning when it differs from the checkpoint's.
"""

from __future__ import annotations

import os
from typing import Any

from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from cloc_lightning.data.stores import StoreGroup

__all__ = ["DataSeedMixin"]

#: the data module's attributes that name where its data comes from (for the stores' and the run's records)
SOURCE_ATTRIBUTES = ("root", "csv_path", "test_root", "test_csv", "train_split", "val_fraction")


class DataSeedMixin:
    """``train_seed`` (the seed in use), its resolution at setup and restoration from a checkpoint, and the run record."""

    seed: int | None
    _run_seed: int | None

    @property
    def train_seed(self) -> int:
        """The seed of the training order and augmentations: ``data.seed``, else the run's (resolved at setup)."""
        if self.seed is not None:
            return int(self.seed)
        return self.resolve_seed()

    def seed_origin(self) -> str:
        """Where :attr:`train_seed` comes from: ``data.seed``, ``seed_everything``, ``checkpoint`` or ``default``."""
        if self.seed is not None:
            return "data.seed"
        self.resolve_seed()
        return getattr(self, "_seed_origin", "default")

    def resolve_seed(self) -> int:
        """The run's seed (``PL_GLOBAL_SEED``, rank 0's under DDP; 0 when unseeded), once; every process must call it together."""
        if self.seed is not None:
            return int(self.seed)
        if self._run_seed is None:
            env = os.environ.get("PL_GLOBAL_SEED")
            local = int(env) if env not in (None, "") else None
            seed, origin = StoreGroup.of_trainer(getattr(self, "trainer", None)).broadcast(
                (local, "seed_everything" if local is not None else "default")
            )
            self._run_seed = 0 if seed is None else int(seed)
            self._seed_origin = origin
            rank_zero_info(
                f"{type(self).__name__}: data.seed is null, so the training order and augmentations use the run's seed "
                f"{self._run_seed}" + ("" if seed is not None else " (the run is not seeded: 0)")
            )
        return self._run_seed

    def _restore_seed(self, saved: Any) -> None:
        """A checkpoint's ``data_seed``: adopted when ``data.seed`` is unset; an explicit one wins, with a warning if they differ."""
        if saved is None:
            return
        saved = int(saved)
        if self.seed is not None:
            if int(self.seed) != saved:
                rank_zero_warn(
                    f"the checkpoint was trained with data seed {saved}, and data.seed={self.seed} is set: the resumed run draws "
                    "another order and other augmentations than the uninterrupted one would; set data.seed: null to continue it exactly"
                )
            return
        if self._run_seed == saved:
            return
        if self._run_seed is not None:
            rank_zero_info(f"{type(self).__name__}: the checkpoint's data seed {saved} replaces the run's {self._run_seed} (exact resume)")
        self._run_seed = saved
        self._seed_origin = "checkpoint"
        for ds in [getattr(self, "train_set", None), *getattr(self, "_device_sets", {}).values()]:
            if ds is not None and getattr(ds, "seed", None) is not None:
                ds.seed = saved
        augment = getattr(self, "_device_augment", None)
        if augment is not None:
            augment.seed = saved

    def data_source(self) -> str:
        """What the data is, in one line: the class and the attributes naming its files (``root``, ``csv_path``, ...)."""
        parts = []
        for name in SOURCE_ATTRIBUTES:
            value = getattr(self, name, None)
            if value is None:
                continue
            if isinstance(value, str) and name.endswith(("root", "csv", "path")):
                value = os.path.abspath(os.path.expanduser(value))
            parts.append(f"{name}={value}")
        return f"{type(self).__name__}({', '.join(parts)})"

    def run_record(self) -> dict[str, Any]:
        """What a run folder keeps of the data (``data.json``): the source, the seed in use and where it came from, the stores."""
        return {
            "data_module": f"{type(self).__module__}.{type(self).__qualname__}",
            "source": self.data_source(),
            "seed": self.train_seed,
            "seed_from": self.seed_origin(),
            "cache": getattr(self, "cache", None),
            "augment_on": getattr(self, "augment_on", None),
            "stores": list(getattr(self, "store_records", [])),
        }
