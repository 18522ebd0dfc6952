"""Keep Lightning's advertising tips out of cloc-lightning's output.

Lightning (>= 2.5) prints "💡 Tip: … try installing [litlogger] …" when a Trainer is built
and "💡 Tip: … [litmodels] …" when it fits, on rank 0 of every run (and again in every
``ddp_spawn`` worker).  They are not about the user's run, so a filter on Lightning's
rank-zero loggers drops exactly the messages that start with "💡 Tip"; every other
message is untouched.  Installed when :mod:`cloc_lightning` is imported (also in spawned
DDP workers, which import it to unpickle the model).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

__all__ = ["drop_lightning_tips", "debug_requested", "exit_with_error"]

_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero",
            "pytorch_lightning.utilities.rank_zero", "lightning_fabric.utilities.rank_zero")


class _DropLightningTips(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).lstrip().startswith("💡 Tip")


def drop_lightning_tips() -> None:
    """Add the filter to Lightning's rank-zero loggers (idempotent)."""
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropLightningTips) for f in logger.filters):
            logger.addFilter(_DropLightningTips())


def debug_requested(argv: Sequence[str]) -> bool:
    """``--debug`` anywhere on the command line, or ``CLOC_LIGHTNING_DEBUG=1``: show tracebacks instead of one error line."""
    return "--debug" in argv or os.environ.get("CLOC_LIGHTNING_DEBUG", "") not in ("", "0")


def exit_with_error(err: BaseException) -> NoReturn:
    """Print a library error (whose message names the fix) as one ``cloc-lightning: error:`` line and exit with code 1."""
    print(f"cloc-lightning: error: {err}\n(--debug shows the traceback)", file=sys.stderr, flush=True)
    raise SystemExit(1) from None
