"""The data modules' configuration error and the argument checks that raise it.

Every problem with the data as configured (a missing root or file, a label outside the classes, an
unusable split, a bad data-module argument) is a :class:`DataConfigError`: a ``ValueError`` whose
message names the fix.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from cloc_lightning.validation import check_float

__all__ = [
    "DataConfigError",
    "config_errors",
    "check_val_fraction",
    "check_split_fractions",
    "check_base_sets",
    "check_triple",
    "is_uint8_batch",
    "auto_workers",
]


class DataConfigError(ValueError):
    """The data (root, files, labels, split) cannot be used as configured; the message names the fix."""


@contextlib.contextmanager
def config_errors() -> Iterator[None]:
    """Argument checks (:mod:`cloc_lightning.validation`) in the block raise :class:`DataConfigError`.

    A data module's bad argument is a configuration error like a missing folder, so every
    one of them is a :class:`DataConfigError` (a ``ValueError``) with the check's message.
    """
    try:
        yield
    except DataConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise DataConfigError(str(e)) from e


def check_val_fraction(value: Any) -> float:
    """``val_fraction`` in ``[0, 1)`` (a share of the training data held out), else a :class:`DataConfigError`."""
    with config_errors():
        return check_float(
            "val_fraction", value, minimum=0.0, maximum=1.0, strict_maximum=True, expect="in [0, 1)", hint="0 = validate on the test set"
        )


def check_split_fractions(value: Any) -> tuple[float, float, float]:
    """``split_fractions``: three shares ``(train, val, test)`` >= 0 with a positive sum, else a
    :class:`DataConfigError`; shares that do not sum to 1 are read as proportions, with a warning that says so
    (``[0.5, 0.5, 0.5]`` is thirds)."""
    try:
        fractions = tuple(float(f) for f in value)
    except (TypeError, ValueError):
        fractions = ()
    if len(fractions) != 3 or min(fractions) < 0 or sum(fractions) <= 0:
        raise DataConfigError(
            f"--data.split_fractions {list(value) if isinstance(value, (list, tuple)) else value!r}: three shares "
            "(train, val, test) >= 0 that sum to 1, e.g. [0.7, 0.1, 0.2]"
        )
    total = sum(fractions)
    if abs(total - 1.0) > 1e-6:
        shares = ", ".join(f"{f / total:.3g}" for f in fractions)
        warnings.warn(
            f"--data.split_fractions {list(fractions)} sum to {total:g}, not 1: read as proportions, [{shares}]; give shares "
            "that sum to 1 to say so",
            UserWarning,
            stacklevel=2,
        )
    return fractions[0], fractions[1], fractions[2]


def check_root_for_stage(
    owner: str,
    stage: str | None,
    test_root: str | None,
    layout: str,
    predict_alone: bool,
    without_root: str = "data.test_root (test)",
    *,
    root_key: str = "data.root",
    test_key: str = "data.test_root",
) -> None:
    """Refuse a stage that needs ``data.root`` when it is not set (``owner``'s ``root`` is ``None``).

    Without ``root`` a data module serves ``test`` on ``test_root`` and ``predict`` (on
    ``test_root``, or on ``predict_root`` alone when ``predict_alone``); ``fit`` and ``validate``
    have no data.  ``layout`` describes what ``root`` should hold, ``without_root`` the settings that evaluate without it;
    ``root_key`` / ``test_key`` name the two settings (``data.csv_path`` / ``data.test_csv`` for a CSV).
    """
    if stage == "predict" and predict_alone:
        return
    if test_root is None:
        raise DataConfigError(f"{owner}: {root_key} is not set; set it to {layout}, or {without_root} to evaluate data of your own")
    if stage not in ("test", "predict"):
        raise DataConfigError(
            f"{owner}: {root_key} is not set, so there is no training or validation data for "
            f"{stage or 'fit'}; set {root_key} ({test_key} {test_root!r} alone serves test and predict)"
        )


def check_base_sets(owner: str, base: Any) -> Any:
    """``base`` as ``build_base_sets`` must return it, else a :class:`DataConfigError` naming what is wrong and the fix.

    The contract: a dict with the keys ``train``, ``val`` and ``test``, each a labelled dataset (a
    ``LabelledDataset`` of :mod:`cloc_lightning.data`: ``load(i)``, ``targets``, ``len``).
    """
    fix = (
        f"{owner}.build_base_sets must return {{'train': ..., 'val': ..., 'test': ...}}, each a labelled dataset such as "
        "cloc_lightning.data.ImageFileDataset(files, labels) or TensorImageDataset(images, labels), after setting "
        "self.class_names (docs/extending.md, the tutorial)"
    )
    if not isinstance(base, dict):
        raise DataConfigError(f"{owner}.build_base_sets returned a {type(base).__name__}; {fix}")
    missing = [k for k in ("train", "val", "test") if k not in base]
    if missing:
        raise DataConfigError(f"{owner}.build_base_sets returned no {missing} set(s) (keys: {sorted(map(str, base))}); {fix}")
    for split in ("train", "val", "test"):
        ds = base[split]
        lacks = [a for a in ("load", "targets", "__len__") if not hasattr(ds, a)]
        if lacks:
            raise DataConfigError(f"{owner}.build_base_sets: the {split} set is a {type(ds).__name__} without {lacks}; {fix}")
    return base


def check_triple(name: str, value: Any, *, positive: bool) -> tuple[float, float, float] | None:
    """``None``, or three finite numbers (``positive``: each > 0), else a ``ValueError``/``TypeError`` naming ``name``."""
    if value is None:
        return None
    hint = f"give one number per RGB channel, e.g. {name}: [0.5, 0.5, 0.5], or null for the data module's own"
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) != 3:
        raise ValueError(f"{name} must be three numbers (R, G, B), got {value!r}; {hint}")
    lo = 0.0 if positive else None
    a, b, c = (check_float(f"{name}[{i}]", v, minimum=lo, strict_minimum=positive, hint=hint) for i, v in enumerate(value))
    return (a, b, c)


def is_uint8_batch(x: Any) -> bool:
    """Whether ``x`` is a ``uint8 [B, 3, H, W]`` batch (the device path's evaluation images)."""
    return isinstance(x, torch.Tensor) and x.dtype == torch.uint8 and x.ndim == 4


def auto_workers() -> int:
    """``num_workers: null``: one loader worker per CPU this process may use, but one, at most 8."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(8, max(0, cpus - 1))
