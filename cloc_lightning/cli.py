"""The ``cloc-lightning`` command: LightningCLI over every registered module and data module.

::

    cloc-lightning fit --config configs/cloc/demo.yaml          # train (+ test with test_after_fit)
    cloc-lightning fit --model CEModule --data UTKFaceDataModule --data.root data/utkface \
        --model.num_classes 8
    cloc-lightning test --config cfg.yaml --ckpt_path runs/.../best.ckpt
    cloc-lightning predict --config cfg.yaml --ckpt_path best.ckpt   # writes predictions.csv
    cloc-lightning fit --help ; cloc-lightning fit --model.help CLOCModule
    cloc-lightning fit --config cfg.yaml --ckpt_path last            # resume the newest last.ckpt of this run

Every subclass of :class:`~cloc_lightning.methods.base.BaseModule` and
:class:`~cloc_lightning.data.base.BaseDataModule` that is imported is selectable by
name with ``--model`` / ``--data`` (or ``class_path`` in YAML), including your
own classes: ``--model my_project.MyCLOC``.  The sub-commands ``probe``, ``export-prototypes`` and
``configs`` (list, show, copy the shipped YAML configs) live in :mod:`cloc_lightning.commands`; the
guide is ``docs/cli.md``.

``--config configs/cloc/demo.yaml`` (or ``-c``, ``--config=...``) where no such file exists, e.g. after
a wheel install outside the repository, uses the config shipped in the package and says so on
stderr (:func:`packaged_config_fallback`).
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from collections.abc import Callable
from typing import Any

import yaml
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities.exceptions import SIGTERMException

import cloc_lightning.data  # registers the data modules (also imported for BaseDataModule below)
import cloc_lightning.methods  # noqa: F401  (registers the modules)
from cloc_lightning._logging import debug_requested, exit_with_error
from cloc_lightning.callbacks import PredictionWriter
from cloc_lightning.callbacks.preemption import SIGTERM_EXIT_CODE
from cloc_lightning.checkpoints import read_checkpoint
from cloc_lightning.commands import COMMANDS
from cloc_lightning.configs import packaged_config_for
from cloc_lightning.data.base import BaseDataModule
from cloc_lightning.methods.base import BaseModule
from cloc_lightning.resume import checkpoint_position, find_last_checkpoint

__all__ = ["CLOCLightningCLI", "main", "EXTRA_COMMANDS", "find_last_checkpoint", "packaged_config_fallback"]

TRAINER_DEFAULTS: dict[str, Any] = {
    "logger": {
        "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
        "init_args": {"save_dir": "runs", "name": "default"},
    },
}

#: the sub-commands beside LightningCLI's (``probe``, ``export-prototypes``, ``configs``): the registry of
#: :mod:`cloc_lightning.commands` (this name is kept for older code that registers commands here)
EXTRA_COMMANDS: dict[str, Callable[[list[str] | None], Any]] = COMMANDS


#: model arguments that say how a run executes, not what the model is (speed options): a run resumed
#: with ``--ckpt_path`` takes them from its command line / config, not from the checkpoint
RUN_OPTIONS = ("compile_backbone", "channels_last", "optimizer_fused", "optimizer_foreach")


def _run_options_target(model: Any) -> Any:
    """The namespace holding the model's arguments (``init_args`` of a ``class_path`` config, else the model's own)."""
    if model is None or not hasattr(model, "get"):
        return None
    init_args = model.get("init_args")
    return init_args if init_args is not None and hasattr(init_args, "get") else model


def _run_options(model: Any) -> dict[str, Any]:
    """The :data:`RUN_OPTIONS` values of a parsed model config (those it holds)."""
    args = _run_options_target(model)
    if args is None:
        return {}
    return {key: copy.deepcopy(args.get(key)) for key in RUN_OPTIONS if key in args}


class CLOCLightningCLI(LightningCLI):
    """LightningCLI with ``test_after_fit``, exact ``--ckpt_path last`` resume into the same run folder,
    checkpoint/config checks, a prediction writer for ``predict`` and the extra sub-commands in ``--help``."""

    def __init__(self, *pos: Any, **kwargs: Any) -> None:
        given = kwargs.get("args")
        #: the command line as given (integers of ``--trainer.limit_*_batches`` are read from it)
        self._raw_args = [str(a) for a in given] if isinstance(given, (list, tuple)) else sys.argv[1:]
        super().__init__(*pos, **kwargs)

    def add_arguments_to_parser(self, parser: Any) -> None:
        parser.add_argument(
            "--test_after_fit",
            type=bool,
            default=False,
            help="After fit, run test on the best checkpoint (or the final weights without one) and print the metrics.",
        )

    def setup_parser(self, add_subcommands: bool, main_kwargs: dict[str, Any], subparser_kwargs: dict[str, Any]) -> None:
        super().setup_parser(add_subcommands, main_kwargs, subparser_kwargs)
        extra = "\n".join(f"  {name:<18} {_first_line(fn)}" for name, fn in EXTRA_COMMANDS.items())
        self.parser.epilog = (
            f"other commands (not LightningCLI sub-commands; each has its own --help):\n{extra}\n\n"
            "--debug (anywhere on the command line) shows full tracebacks instead of the short error message."
        )
        self.parser.formatter_class = argparse.RawDescriptionHelpFormatter

    def _cfg(self) -> Any:
        return self.config[self.subcommand] if self.subcommand else self.config

    # ------------------------------------------------------------------ parsing
    def _parse_ckpt_path(self) -> None:
        """Refuse a ``--ckpt_path`` of another module class or backbone before Lightning adopts its hyper-parameters.

        Lightning's CLI replaces the configured model by the one recorded in the checkpoint,
        so a checkpoint of another method would silently be tested/resumed instead of the
        configured one.  The speed options (:data:`RUN_OPTIONS`) stay the configured ones: a
        compiled run resumes plain and a plain run compiled, as the command line says.
        """
        sub = self.config.get("subcommand")
        ckpt_path = self.config[sub].get("ckpt_path") if sub else None
        if ckpt_path and os.path.isfile(ckpt_path):
            check_config_against_checkpoint(self.config[sub].get("model"), ckpt_path)
        kept = _run_options(self.config[sub].get("model")) if sub else {}
        super()._parse_ckpt_path()
        if kept:  # how this run executes is the command line's / config's, not the checkpoint's
            args = _run_options_target(self.config[sub].get("model"))
            if args is not None:
                for key, value in kept.items():
                    args[key] = value

    def instantiate_trainer(self, **kwargs: Any) -> Any:
        cfg = self.config[self.subcommand] if self.subcommand else self.config
        return super().instantiate_trainer(**{**_integer_batch_limits(cfg, self._raw_args), **kwargs})

    # ------------------------------------------------------------------ subcommands
    def _resolve_ckpt_path(self) -> None:
        """``--ckpt_path last`` -> the run's newest ``last*.ckpt``; a resumed fit logs into the checkpoint's run folder."""
        cfg = self.config_init[self.subcommand]
        given = path = cfg.get("ckpt_path")
        if path == "last":
            path = find_last_checkpoint(self.trainer)
            if path is None:
                _print0(self.trainer, "--ckpt_path last: no last checkpoint found for this run; training starts from scratch")
            cfg["ckpt_path"] = path
        if path and os.path.isfile(path) and self.subcommand == "fit":
            # a resumed fit continues its run folder (validate/test/predict log into a new one and
            # never overwrite the training run's config.yaml)
            version = _version_folder_of(self.trainer, path)
            if version is not None:
                _pin_logger_version(self.trainer, version)
            info = checkpoint_position(path)
            folder = f"its run folder {version}" if version else "a new run folder (the checkpoint is not in this logger's folders)"
            _print0(self.trainer, f"--ckpt_path {given}: resuming from {path} ({info}); logging into {folder}")
        _pin_logger_version(self.trainer, None)  # fix the folder now: ddp_spawn workers and the main process agree

    def _before_subcommand(self) -> None:
        """``before_<fit|validate|test|predict>``: resolve ``--ckpt_path``; ``predict`` also writes its predictions."""
        self._resolve_ckpt_path()
        callbacks: list[Any] = self.trainer.callbacks  # type: ignore[attr-defined]  # set by Lightning at runtime, not declared on Trainer
        if self.subcommand == "predict" and not any(isinstance(cb, PredictionWriter) for cb in callbacks):
            callbacks.append(PredictionWriter())

    before_fit = before_validate = before_test = before_predict = _before_subcommand

    def after_fit(self) -> None:
        trainer = self.trainer
        ckpt = trainer.checkpoint_callback
        best = getattr(ckpt, "best_model_path", "") if ckpt is not None else ""
        if self._cfg().get("test_after_fit", False) and not trainer.interrupted:
            # decided on rank 0 and broadcast: every rank must test the same weights (another node may not see the file)
            ckpt_path = trainer.strategy.broadcast(best if best and os.path.isfile(best) else None)
            if ckpt_path is None:
                _print0(trainer, "test_after_fit: no best checkpoint was saved; testing the final weights")
            trainer.test(self.model, datamodule=self.datamodule, ckpt_path=ckpt_path)
        self._closing_lines(best)

    def _closing_lines(self, best: str = "") -> None:
        """``logs (TensorBoard): <run folder>`` (and the best checkpoint after fit), printed by rank 0."""
        trainer = self.trainer
        log_dir = trainer.log_dir  # a broadcast under DDP: every rank must read it, not rank 0 alone
        if trainer.is_global_zero:
            if log_dir:
                print(f"logs (TensorBoard): {log_dir}")
            if best:
                print(f"best checkpoint: {best}")

    after_validate = after_test = after_predict = _closing_lines


def _first_line(fn: Any) -> str:
    doc = (getattr(fn, "__doc__", None) or "").strip()
    return doc.splitlines()[0] if doc else ""


def _print0(trainer: Any, message: str) -> None:
    """Print on global rank 0 only (no collective)."""
    if trainer.is_global_zero:
        print(message, flush=True)


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
    for logger in trainer.loggers:
        if not hasattr(logger, "_version"):
            continue
        if version is not None and getattr(logger, "_experiment", None) is None:
            logger._version = version
        else:
            _ = logger.version  # computes and stores the next free version


def _integer_batch_limits(cfg: Any, raw_args: list[str]) -> dict[str, int]:
    """The Trainer arguments to pass as integers: ``--trainer.limit_train_batches 1`` means one batch, as in
    Lightning's ``Trainer(limit_train_batches=1)``.

    jsonargparse reads ``int | float`` arguments as floats (``1`` -> ``1.0`` = 100 % of the
    batches).  An integer written on the command line or in a YAML config stays an integer
    (a number of batches); ``1.0`` / ``0.25`` stay fractions.
    """
    raw = _raw_trainer_values(cfg, raw_args)
    trainer = cfg.get("trainer") or {}
    fixed: dict[str, int] = {}
    for key in _BATCH_LIMITS:
        value, given = trainer.get(key), raw.get(key)
        if isinstance(value, float) and isinstance(given, int) and not isinstance(given, bool) and value == given:
            fixed[key] = int(given)
    return fixed


_BATCH_LIMITS = ("limit_train_batches", "limit_val_batches", "limit_test_batches", "limit_predict_batches",
                 "val_check_interval")


def _raw_trainer_values(cfg: Any, raw_args: list[str]) -> dict[str, Any]:
    """The last value given for each batch-limit key, as written: YAML values, then command-line strings."""
    found: dict[str, Any] = {}
    for path in cfg.get("config") or []:
        try:
            if hasattr(path, "get_content"):
                text = path.get_content()
            else:
                with open(str(path)) as f:
                    text = f.read()
            data = yaml.safe_load(text) or {}
        except (OSError, TypeError, ValueError, yaml.YAMLError):
            continue
        trainer = data.get("trainer") if isinstance(data, dict) else None
        if isinstance(trainer, dict):
            found.update({k: trainer[k] for k in _BATCH_LIMITS if k in trainer})
    for i, arg in enumerate(raw_args):
        for key in _BATCH_LIMITS:
            flag = f"--trainer.{key}"
            if arg == flag and i + 1 < len(raw_args):
                text = raw_args[i + 1]
            elif arg.startswith(flag + "="):
                text = arg.split("=", 1)[1]
            else:
                continue
            found[key] = int(text) if text.strip().isdigit() else text
    return found


def check_config_against_checkpoint(model_cfg: Any, ckpt_path: str) -> None:
    """Raise :class:`~cloc_lightning.checkpoints.CheckpointMismatchError` when ``ckpt_path`` was written by another
    module class or backbone than the configured ``model`` (``class_path`` + ``init_args``)."""
    import importlib

    from cloc_lightning.checkpoints import CheckpointMismatchError, checkpoint_mismatch

    if model_cfg is None or not model_cfg.get("class_path"):
        return
    class_path = str(model_cfg["class_path"])
    module_name, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError):
        return  # jsonargparse has already reported unknown classes
    init_args = model_cfg.get("init_args")
    hparams = dict(init_args.as_dict() if hasattr(init_args, "as_dict") else (init_args or {}))
    ckpt = read_checkpoint(ckpt_path, mmap=True, what="--ckpt_path", hint="give an existing .ckpt file, or --ckpt_path last")
    why = checkpoint_mismatch(cls, hparams, ckpt)
    if why is not None:
        raise CheckpointMismatchError(
            f"--ckpt_path {ckpt_path}: {why}. Use the config the checkpoint was trained with (saved as config.yaml "
            "in its run folder), pass a checkpoint of the configured model, or take its matching weights with "
            "--model.init_args.init_from <ckpt> instead."
        )


#: exception types whose messages (raised by cloc_lightning) name the fix: shown short, without a traceback
_USER_ERRORS = (ValueError, TypeError, FileNotFoundError, NotADirectoryError, IsADirectoryError, FileExistsError, FloatingPointError,
                RuntimeError, ImportError)


def library_error(exc: BaseException) -> BaseException | None:
    """The exception raised by cloc_lightning itself somewhere in ``exc``'s cause/context chain, if any.

    jsonargparse re-raises a constructor's ``ValueError`` as "Does not validate against any of
    the Union subtypes" with a Namespace dump; the library's own message is its cause.
    """
    seen: set[int] = set()
    found: BaseException | None = None
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, _USER_ERRORS) and _raised_in_package(cur):
            found = cur
        cur = cur.__cause__ or cur.__context__
    return found


def _raised_in_package(exc: BaseException) -> bool:
    tb = exc.__traceback__
    last = None
    while tb is not None:
        last = tb
        tb = tb.tb_next
    if last is None:
        return False
    filename = last.tb_frame.f_code.co_filename
    return os.path.dirname(os.path.abspath(__file__)) in os.path.abspath(filename)


def packaged_config_fallback(argv: list[str]) -> list[str]:
    """``argv`` with each ``--config X`` / ``-c X`` / ``--config=X`` that names no file but a shipped config replaced by its path.

    After a wheel install, the README's ``cloc-lightning fit --config configs/cloc/demo.yaml``
    runs anywhere: ``configs/cloc/demo.yaml`` does not exist outside the repository, so the
    packaged copy is used and one line on stderr says so.  Which values count as a shipped
    config: :func:`cloc_lightning.configs.packaged_config_for` (relative paths like
    ``configs/cloc/demo.yaml``, ``cloc/demo.yaml``, ``cloc/demo``).  Existing files and
    anything else are left alone, so a missing file of your own fails as before.
    """
    out = list(argv)
    for i, arg in enumerate(argv):
        if arg in ("--config", "-c") and i + 1 < len(argv):
            at, prefix, value = i + 1, "", argv[i + 1]
        elif arg.startswith("--config="):
            at, prefix, value = i, "--config=", arg.split("=", 1)[1]
        else:
            continue
        cfg = packaged_config_for(value)
        if cfg is None:
            continue
        out[at] = prefix + str(cfg.path)
        if all(os.environ.get(k, "0") == "0" for k in ("RANK", "LOCAL_RANK", "SLURM_PROCID")):
            print(f"cloc-lightning: --config {value}: no such file here; using the packaged config {cfg.name} ({cfg.path})",
                  file=sys.stderr, flush=True)
    return out


def main(args: list[str] | None = None) -> None:
    """Entry point of ``cloc-lightning`` and ``python -m cloc_lightning``.

    Errors that the library raises with a message naming the fix are printed as one short
    ``error:`` line (exit code 1), for LightningCLI's sub-commands and the extra ones
    (:data:`EXTRA_COMMANDS`) alike; ``--debug`` anywhere on the command line (or
    ``CLOC_LIGHTNING_DEBUG=1``) shows the full traceback instead.  A ``--config`` naming a
    shipped config that is not a file here uses the packaged file (:func:`packaged_config_fallback`).
    """
    argv = sys.argv[1:] if args is None else list(args)
    debug = debug_requested(argv)
    argv = [a for a in argv if a != "--debug"]
    try:
        if not argv or argv[0] != "configs":
            argv = packaged_config_fallback(argv)
        if argv and argv[0] in EXTRA_COMMANDS:
            EXTRA_COMMANDS[argv[0]](argv[1:])
            return
        if args is None:  # console use: LightningCLI reads sys.argv (warns when given both)
            sys.argv = sys.argv[:1] + argv
        CLOCLightningCLI(
            BaseModule,
            BaseDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            trainer_defaults=TRAINER_DEFAULTS,
            save_config_kwargs={"overwrite": True},
            args=None if args is None else argv,
        )
    except SIGTERMException as e:  # Lightning's SystemExit *without* a code (exit 0): a preempted command must not look finished
        print(f"cloc-lightning: SIGTERM received; stopped without finishing (exit code {SIGTERM_EXIT_CODE})",
              file=sys.stderr, flush=True)
        raise SystemExit(SIGTERM_EXIT_CODE) from e
    except Exception as e:  # re-raised unless it is the library's own message
        err = None if debug else library_error(e)
        if err is None:
            raise
        exit_with_error(err)
