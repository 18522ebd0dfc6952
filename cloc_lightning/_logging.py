"""What cloc-lightning prints: the one rank-0 printer, the one-line errors, and no Lightning advertising.

:func:`print_line` is how library code prints during a run (methods, callbacks, ``nn``): on global rank 0
only, on a line of its own while a progress bar is drawn.

Keep Lightning's advertising tips out of cloc-lightning's output.

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
from typing import Any, NoReturn, TextIO

__all__ = ["drop_lightning_tips", "debug_requested", "exit_with_error", "print_line"]

_LOGGERS = (
    "lightning.pytorch.utilities.rank_zero",
    "lightning.fabric.utilities.rank_zero",
    "pytorch_lightning.utilities.rank_zero",
    "lightning_fabric.utilities.rank_zero",
)


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


def print_line(trainer: Any, message: str, file: TextIO | None = None) -> None:
    """Print ``message`` on a line of its own on global rank 0, also while a progress bar is drawn.

    The one printer of the library's messages during a run.  ``trainer`` says the rank
    (``trainer.is_global_zero``); without one (``None``: plain Python use, or code that has no
    trainer at hand) Lightning's rank (``rank_zero_only.rank``, from the launcher's environment)
    does.  A plain ``print`` while Lightning's tqdm bar is on screen continues the bar's line
    (``Epoch 4: 100%|…| 12/12 [...]CLOC margins (frozen) written to …``); ``tqdm.write``
    clears the bars, prints the line and redraws them.  Other progress bars print through
    their own ``print``.  Nothing here synchronises processes or the device.
    """
    if trainer is not None:
        if not trainer.is_global_zero:
            return
    else:
        from lightning.pytorch.utilities import rank_zero_only

        if getattr(rank_zero_only, "rank", 0) != 0:
            return
    out = sys.stdout if file is None else file
    bar = getattr(trainer, "progress_bar_callback", None) if trainer is not None else None
    if bar is None or not bar.is_enabled:
        print(message, file=out, flush=True)
        return
    from lightning.pytorch.callbacks import TQDMProgressBar

    if isinstance(bar, TQDMProgressBar):
        from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

        Tqdm.write(message, file=out)
        out.flush()
    else:
        bar.print(message)
