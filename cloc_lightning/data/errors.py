"""The data modules' configuration error and the argument checks that raise it.

Every problem with the data as configured (a missing root or file, a label outside the classes, an
unusable split, a bad data-module argument) is a :class:`DataConfigError`: a ``ValueError`` whose
message names the fix.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from cloc_lightning.validation import check_float

__all__ = ["DataConfigError", "config_errors", "check_val_fraction"]


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
