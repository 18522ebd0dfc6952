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
own classes: ``--model my_project.MyCLOC``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from lightning.pytorch.cli import LightningCLI

import cloc_lightning.data  # noqa: F401  (registers the data modules)
import cloc_lightning.methods  # noqa: F401  (registers the modules)
from cloc_lightning.callbacks import PredictionWriter
from cloc_lightning.data.base import BaseDataModule
from cloc_lightning.methods.base import BaseModule

__all__ = ["CLOCLightningCLI", "main", "EXTRA_COMMANDS", "find_last_checkpoint"]

TRAINER_DEFAULTS: dict[str, Any] = {
    "logger": {
        "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
        "init_args": {"save_dir": "runs", "name": "default"},
    },
}

#: extra sub-commands (name -> callable(argv)); methods register theirs here
EXTRA_COMMANDS: dict[str, Any] = {}


def _probe_command(argv: list[str]) -> None:
    """``cloc-lightning probe``: offline scikit-learn probe of a checkpoint (:func:`cloc_lightning.probe.main`)."""
    from cloc_lightning.probe import main as probe_main

    probe_main(argv)


def _export_prototypes_command(argv: list[str]) -> None:
    """``cloc-lightning export-prototypes CKPT OUT``: OrdinalCLIP checkpoint -> prototype classifier file."""
    from cloc_lightning.methods.ordinal_clip import export_prototypes_main

    export_prototypes_main(argv)


EXTRA_COMMANDS["probe"] = _probe_command
EXTRA_COMMANDS["export-prototypes"] = _export_prototypes_command


class CLOCLightningCLI(LightningCLI):
    """LightningCLI with ``test_after_fit`` and a prediction writer for ``predict``."""

    def add_arguments_to_parser(self, parser: Any) -> None:
        parser.add_argument(
            "--test_after_fit",
            type=bool,
            default=False,
            help="After fit, run test on the best checkpoint (or the final weights without one) and print the metrics.",
        )

    def _cfg(self) -> Any:
        return self.config[self.subcommand] if self.subcommand else self.config

    def after_fit(self) -> None:
        trainer = self.trainer
        ckpt = trainer.checkpoint_callback
        best = getattr(ckpt, "best_model_path", "") if ckpt is not None else ""
        if self._cfg().get("test_after_fit", False) and not trainer.interrupted:
            ckpt_path = best if best and os.path.isfile(best) else None
            if ckpt_path is None and trainer.is_global_zero:
                print("test_after_fit: no best checkpoint was saved; testing the final weights")
            trainer.test(self.model, datamodule=self.datamodule, ckpt_path=ckpt_path)
        log_dir = trainer.log_dir  # a broadcast under DDP: every rank must read it, not rank 0 alone
        if trainer.is_global_zero:
            if log_dir:
                print(f"logs (TensorBoard): {log_dir}")
            if best:
                print(f"best checkpoint: {best}")

    def before_fit(self) -> None:
        """``--ckpt_path last``: the newest ``last*.ckpt`` of this run's earlier versions (see :func:`find_last_checkpoint`)."""
        cfg = self.config_init[self.subcommand] if self.subcommand else self.config_init
        if cfg.get("ckpt_path") != "last":
            return
        path = find_last_checkpoint(self.trainer)
        if self.trainer.is_global_zero:
            if path is None:
                print("--ckpt_path last: no last checkpoint found for this run; training starts from scratch")
            else:
                print(f"--ckpt_path last: resuming from {path}")
        cfg["ckpt_path"] = path

    def before_predict(self) -> None:
        if not any(isinstance(cb, PredictionWriter) for cb in self.trainer.callbacks):
            self.trainer.callbacks.append(PredictionWriter())


def find_last_checkpoint(trainer: Any) -> str | None:
    """The most recently written ``last*.ckpt`` of this run, in any of its logger versions.

    Lightning resolves ``ckpt_path="last"`` in the checkpoint folder of the *current*
    logger version only, and a new process starts a new version (``version_1``), so the
    previous run's ``last.ckpt`` would be missed and training would silently restart.
    Searched: the ``dirpath`` of configured ``ModelCheckpoint`` callbacks,
    ``<save_dir>/<name>/*/checkpoints`` of the first logger, and
    ``<default_root_dir>/checkpoints`` (no logger).
    """
    import glob

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
    candidates = [
        f for d in folders for f in glob.glob(os.path.join(glob.escape(d), "last*.ckpt")) if os.path.isfile(f)
    ]
    return max(candidates, key=os.path.getmtime) if candidates else None


def main(args: list[str] | None = None) -> None:
    """Entry point of ``cloc-lightning`` and ``python -m cloc_lightning``."""
    argv = sys.argv[1:] if args is None else list(args)
    if argv and argv[0] in EXTRA_COMMANDS:
        EXTRA_COMMANDS[argv[0]](argv[1:])
        return
    CLOCLightningCLI(
        BaseModule,
        BaseDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        trainer_defaults=TRAINER_DEFAULTS,
        save_config_kwargs={"overwrite": True},
        args=None if args is None else argv,
    )

