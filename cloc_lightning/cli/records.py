"""A run's records: the run folder it writes into and the config it saves there.

A new run claims a run folder no other run's records are in (:func:`_claim_run_folder`); its config is
written once, never over another run's (:class:`RunConfigSaver`); a resumed fit continues the checkpoint's
folder (:func:`_version_folder_of`, :func:`_pin_logger_version`).  The guide is ``docs/reliability.md``.
"""

from __future__ import annotations

import json
import os
from typing import Any

from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.cli import SaveConfigCallback

from cloc_lightning.validation import write_problem

__all__ = ["RunConfigSaver", "RunFolderInUseError", "RunFolderError"]


class RunFolderInUseError(FileExistsError):
    """A new run would write its records into a run folder that already holds another run's."""


class RunFolderError(NotADirectoryError):
    """The logger's ``save_dir`` cannot hold a run folder (a file, or not writable)."""


class RunConfigSaver(SaveConfigCallback):
    """Write the run's config once, into its own run folder, and never over another run's records.

    * A fresh run writes ``config.yaml``; a run folder that already holds one is refused
      (:class:`RunFolderInUseError`: pick another version, or resume with ``--ckpt_path last``).
    * A resumed fit (``fit --ckpt_path``) leaves ``config.yaml`` alone and appends
      ``config.resume-1.yaml``, ``config.resume-2.yaml``, ... (``config.yaml`` if the folder has none).
    * ``validate``/``test``/``predict`` in a folder without a logger version (``--trainer.logger false``)
      write ``config.<command>-N.yaml`` (``config.test-1.yaml``, ``config.predict-1.yaml``, ...), also as the folder's first record: an
      evaluation never claims the folder's ``config.yaml``, so a later ``fit`` there is not refused.

    Only global rank 0 looks at and writes files; the decision is broadcast.  ``overwrite`` is
    accepted for LightningCLI's ``save_config_kwargs`` and ignored: records are never overwritten.
    """

    def __init__(
        self,
        parser: Any,
        config: Any,
        config_filename: str = "config.yaml",
        overwrite: bool = False,
        multifile: bool = False,
        save_to_log_dir: bool = True,
    ) -> None:
        super().__init__(parser, config, config_filename, overwrite=False, multifile=multifile, save_to_log_dir=save_to_log_dir)
        #: set by the CLI before a ``fit`` that continues a checkpoint
        self.resuming = False
        #: the file written (rank 0), for messages and tests
        self.written: str | None = None
        #: the data module's record (``data.json``) written beside it (rank 0)
        self.data_written: str | None = None

    def _write_data(self, record: dict[str, Any]) -> None:
        assert self.data_written is not None
        with get_filesystem(self.data_written).open(self.data_written, "w") as f:
            json.dump(record, f, indent=1)

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        """Write ``data.json`` again once a resumed fit has restored the checkpoint (its data seed wins over the run's)."""
        record = data_record(trainer)
        if trainer.is_global_zero and record is not None and self.data_written is not None:
            self._write_data(record)

    def record_name(self, log_dir: str, stage: str, own_folder: bool = True) -> str:
        """The file this run writes in ``log_dir`` (raises :class:`RunFolderInUseError` for a fresh fit into another run's folder).

        ``stage`` is Lightning's ``TrainerFn`` (or its value); ``own_folder`` is ``False`` where ``log_dir`` is no
        logger version of this run's own (``--trainer.logger false``: ``default_root_dir``), where an evaluation
        writes ``config.<stage>-N.yaml`` even as the first record, leaving ``config.yaml`` to a fit.
        """
        fs = get_filesystem(log_dir)
        first = self.config_filename
        stage = str(getattr(stage, "value", stage))  # TrainerFn.TESTING -> "test" (its str() is "TrainerFn.TESTING" on 3.11)
        evaluation = stage != "fit" and not self.resuming
        if not fs.isfile(os.path.join(log_dir, first)) and (own_folder or not evaluation):
            return first
        stem, ext = os.path.splitext(first)
        kind = "resume" if self.resuming else (stage if stage != "fit" else "")
        if not kind:
            raise RunFolderInUseError(
                f"run folder {log_dir} already holds the records of another run ({first}); a new run never writes into "
                "it: pick another version (--trainer.logger.init_args.version <new>, or leave it unset for the next "
                "free one), another --trainer.default_root_dir without a logger, or resume that run with --ckpt_path last"
            )
        n = 1
        while fs.isfile(os.path.join(log_dir, f"{stem}.{kind}-{n}{ext}")):
            n += 1
        return f"{stem}.{kind}-{n}{ext}"

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self.already_saved or not self.save_to_log_dir:
            super().setup(trainer, pl_module, stage)
            return
        log_dir = trainer.log_dir  # a broadcast: every rank reads it
        assert log_dir is not None
        name, problem = None, None
        if trainer.is_global_zero:
            try:
                name = self.record_name(log_dir, stage, own_folder=bool(_versioned_loggers(trainer)))
            except RunFolderInUseError as e:
                problem = str(e)
        name, problem = trainer.strategy.broadcast((name, problem))
        if problem is not None:
            raise RunFolderInUseError(problem)
        record = data_record(trainer)  # on every process (it may resolve the data seed, a collective)
        if trainer.is_global_zero:
            get_filesystem(log_dir).makedirs(log_dir, exist_ok=True)
            self.written = os.path.join(log_dir, name)
            self.parser.save(self.config, self.written, skip_none=False, overwrite=False, multifile=self.multifile)
            _record_integer_limits(self.written, trainer)
            if record is not None:  # config.yaml -> data.json, config.resume-1.yaml -> data.resume-1.json
                stem = os.path.splitext(name)[0].replace(os.path.splitext(self.config_filename)[0], "data", 1)
                self.data_written = os.path.join(log_dir, f"{stem}.json")
                self._write_data(record)
            self.save_config(trainer, pl_module, stage)
            self.already_saved = True
        self.already_saved = trainer.strategy.broadcast(self.already_saved)


def _record_integer_limits(path: str, trainer: Any) -> None:
    """Write a batch limit the Trainer holds as a count (``limit_train_batches: 1``) as that integer: the parser writes
    ``1.0``, which a run from this config would read back as a fraction (all batches)."""
    import re

    with open(path) as f:
        text = f.read()

    def count(m: re.Match[str]) -> str:
        value = getattr(trainer, m.group(2), None)
        return f"{m.group(1)}{value}" if isinstance(value, int) and not isinstance(value, bool) else m.group(0)

    fixed = re.sub(r"(?m)^(  (limit_(?:train|val|test|predict)_batches): )[0-9.]+$", count, text)
    if fixed != text:
        with open(path, "w") as f:
            f.write(fixed)


def data_record(trainer: Any) -> dict[str, Any] | None:
    """The data module's record for the run folder (its source, data seed and stores), when it keeps one."""
    dm = getattr(trainer, "datamodule", None)
    fn = getattr(dm, "run_record", None)
    return fn() if callable(fn) else None


def _real_loggers(trainer: Any) -> list[Any]:
    """The trainer's loggers but ``fast_dev_run``'s ``DummyLogger`` (which answers every attribute, ``_version`` too)."""
    from lightning.pytorch.loggers.logger import DummyLogger

    return [lg for lg in trainer.loggers if not isinstance(lg, DummyLogger)]


def _versioned_loggers(trainer: Any) -> list[Any]:
    """The loggers that keep a ``<root_dir>/<version>`` run folder (TensorBoard, CSV)."""
    return [lg for lg in _real_loggers(trainer) if hasattr(lg, "_version") and hasattr(lg, "root_dir")]


def _check_save_dir(folder: str) -> None:
    """Raise :class:`RunFolderError` when ``folder`` (a logger's run folder to be) cannot be created or written."""
    if "://" in folder:
        return  # remote file systems: left to the logger
    problem = write_problem(folder)
    if problem is not None and problem.endswith("is a file, not a folder"):
        raise RunFolderError(
            f"logger save_dir: {problem}, so {folder} cannot be created; give --trainer.logger.init_args.save_dir a folder (e.g. runs)"
        )
    if problem is not None:
        raise RunFolderError(
            f"logger save_dir: cannot write the run folder {folder} ({problem}); give "
            "--trainer.logger.init_args.save_dir a folder you can write to"
        )


#: what a run writes into its run folder (other files there, e.g. a scheduler's or job script's own logs, are not a run's records)
_RECORD_PATTERNS = (
    "config*.yaml",
    "data*.json",
    "hparams.yaml",
    "checkpoints",
    "events.out.tfevents.*",
    "metrics.csv",
    "cloc_margins*",
    "predictions*.csv",
    "*.ckpt",
)


def _run_records(folder: str) -> list[str]:
    """The names in ``folder`` that a run of this library (or Lightning's loggers) writes, sorted."""
    import fnmatch

    return sorted(n for n in os.listdir(folder) if any(fnmatch.fnmatch(n, p) for p in _RECORD_PATTERNS))


#: what a run that failed before its first step may have written into the folder it made (nothing of a result)
_EMPTY_RUN_PATTERNS = ("config*.yaml", "data*.json", "hparams.yaml", "events.out.tfevents.*", "metrics.csv")


def _left_empty(folder: str) -> bool:
    """Whether ``folder`` holds only what a run writes before it has a result (its config, hyper-parameters, the
    loggers' first files, an empty ``checkpoints`` folder): no checkpoint, prediction, plot or file of anyone else."""
    import fnmatch

    for entry in os.scandir(folder):
        if entry.is_dir(follow_symlinks=False):
            if entry.name != "checkpoints" or os.listdir(entry.path):
                return False
        elif not any(fnmatch.fnmatch(entry.name, p) for p in _EMPTY_RUN_PATTERNS):
            return False
    return True


#: run folder -> the highest folder above it that did not exist before the command made it (removed with it when empty)
MADE_ABOVE: dict[str, str] = {}


def _claim_run_folder(trainer: Any, pinned: bool, resuming: bool) -> str | None:
    """Before anything is written: the run folder can be written and, for a new run, holds no other run's records.

    An automatically numbered folder that another run took meanwhile (two runs started at once)
    moves this run to the next free number: the folder is created with ``mkdir``, which only one
    process can do.  A pinned ``--trainer.logger.init_args.version`` whose folder holds files is
    refused (:class:`RunFolderInUseError`).  Runs on global rank 0 only.  Returns the folder when this
    call made it (a run that fails before its first step removes it again: :meth:`CLOCLightningCLI._run_subcommand`).
    """
    loggers = _versioned_loggers(trainer)
    if not trainer.is_global_zero or not loggers:
        return None
    logger = loggers[0]
    for _ in range(1000):
        log_dir = str(logger.log_dir)
        above = os.path.abspath(os.path.dirname(log_dir))
        while not os.path.exists(os.path.dirname(above)) and os.path.dirname(above) != above:
            above = os.path.dirname(above)
        if not os.path.exists(above):  # the highest folder this command makes above the run folder
            MADE_ABOVE[os.path.abspath(log_dir)] = above
        _check_save_dir(os.path.dirname(log_dir))
        if resuming:
            _check_save_dir(log_dir)
            return None
        try:
            os.mkdir(log_dir)
            return log_dir
        except FileExistsError:
            pass
        if not os.path.isdir(log_dir):
            raise RunFolderError(f"logger run folder {log_dir} is a file; remove it or pick another version")
        held = _run_records(log_dir)
        if not held:
            return None  # no run's records (empty, or only files of your own, e.g. a job script's log)
        if pinned:
            shown = ", ".join(held[:4]) + (", ..." if len(held) > 4 else "")
            raise RunFolderInUseError(
                f"run folder {log_dir} already holds the records of another run ({shown}); a new run never writes into "
                "it: pick another version (--trainer.logger.init_args.version <new>, or leave it unset for the next "
                "free one) or resume that run with --ckpt_path last"
            )
        logger._version = None  # taken meanwhile by another run: the next free number
    raise RunFolderInUseError(f"no free run folder next to {logger.log_dir}")


def _logger_names(trainer: Any) -> list[str]:
    """The trainer's loggers as the closing line names them: ``TensorBoardLogger`` -> ``TensorBoard``, ``CSVLogger`` -> ``CSV``."""
    names = []
    for logger in _real_loggers(trainer):
        name = type(logger).__name__
        names.append(name[: -len("Logger")] if name.endswith("Logger") and name != "Logger" else name)
    return list(dict.fromkeys(names))


def _version_folder_of(trainer: Any, ckpt_path: str) -> str | None:
    """The logger version folder a checkpoint lives in (``<save_dir>/<name>/<version>/checkpoints/x.ckpt``), if it is this logger's."""
    logger = trainer.logger
    if logger is None or not hasattr(logger, "root_dir"):
        return None
    folder = os.path.dirname(os.path.abspath(ckpt_path))
    if os.path.basename(folder) != "checkpoints":
        return None
    run = os.path.dirname(folder)
    if os.path.abspath(os.path.dirname(run)) != os.path.abspath(str(logger.root_dir)):
        return None
    return os.path.basename(run)


def _pin_logger_version(trainer: Any, version: str | None) -> None:
    """Set (``version``) or fix (``None``: compute it now) the version folder of every logger that has one.

    A resumed fit writes into the checkpoint's run folder, so ``best`` is the best over the
    whole run.  Fixing the version before the strategy launches processes makes the main
    process of ``ddp_spawn`` name the folder its workers wrote (computed later, it would name
    the next, empty one).  Only loggers whose version was not configured are changed.
    """
    for logger in _real_loggers(trainer):
        if not hasattr(logger, "_version"):
            continue
        if version is not None and getattr(logger, "_experiment", None) is None:
            logger._version = version
        else:
            _ = logger.version  # computes and stores the next free version
