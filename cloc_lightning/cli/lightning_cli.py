"""The LightningCLI subclass of ``cloc-lightning``: the data -> model ``num_classes`` link, ``--ckpt_path``
resolution (``last``, resume into the run's folder), the checks that refuse a run before it writes anything,
``test_after_fit`` and the closing lines."""

from __future__ import annotations

import argparse
import copy
import os
import sys
from collections.abc import Iterable
from typing import Any

import yaml
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn

from cloc_lightning._logging import print_line
from cloc_lightning.callbacks import PredictionWriter
from cloc_lightning.callbacks.finite import check_trains_something
from cloc_lightning.checkpoints import import_class, read_checkpoint
from cloc_lightning.cli.commands import COMMANDS
from cloc_lightning.cli.parser import CLOCArgumentParser, _summary, check_required_placeholders
from cloc_lightning.cli.records import (
    MADE_ABOVE,
    RunConfigSaver,
    _claim_run_folder,
    _left_empty,
    _logger_names,
    _pin_logger_version,
    _version_folder_of,
    _versioned_loggers,
)
from cloc_lightning.data_contract import DataInfo
from cloc_lightning.nn.pretrained import normalization_mismatch
from cloc_lightning.resume import checkpoint_position, checkpoint_progress, find_last_checkpoint
from cloc_lightning.threads import apply_default_threads

__all__ = [
    "CLOCLightningCLI",
    "MissingWeightsError",
    "RunFinishedError",
    "TRAINER_DEFAULTS",
    "RUN_OPTIONS",
    "check_config_against_checkpoint",
]

TRAINER_DEFAULTS: dict[str, Any] = {
    "logger": {
        "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
        "init_args": {"save_dir": "runs", "name": "default"},
    },
}

#: model arguments that say how a run executes, not what the model is (speed options): a run resumed
#: with ``--ckpt_path`` takes them from its command line / config, not from the checkpoint
RUN_OPTIONS = ("compile_backbone", "channels_last", "optimizer_fused", "optimizer_foreach")


def _run_options_target(model: Any) -> Any:
    """The namespace holding the model's arguments (``init_args`` of a ``class_path`` config, else the model's own)."""
    if model is None or not hasattr(model, "get"):
        return None
    init_args = model.get("init_args")
    return init_args if init_args is not None and hasattr(init_args, "get") else model


def _given_num_classes(model: Any) -> Any:
    """The model's ``num_classes`` in a parsed config (``None`` when not given)."""
    args = _run_options_target(model)
    return args.get("num_classes") if args is not None else None


def _requires_num_classes(cls: type) -> bool:
    """Whether ``cls``'s constructor has a ``num_classes`` argument without a default (found along ``**kwargs``)."""
    import inspect

    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        try:
            params = inspect.signature(init).parameters
        except (TypeError, ValueError):
            return False
        if "num_classes" in params:
            return params["num_classes"].default is inspect.Parameter.empty
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            return False
    return False


def _run_options(model: Any) -> dict[str, Any]:
    """The :data:`RUN_OPTIONS` values of a parsed model config (those it holds)."""
    args = _run_options_target(model)
    if args is None:
        return {}
    return {key: copy.deepcopy(args.get(key)) for key in RUN_OPTIONS if key in args}


class MissingWeightsError(ValueError):
    """``validate``/``test``/``predict`` without trained weights (no ``--ckpt_path``, no ``init_from``)."""


class RunFinishedError(ValueError):
    """``fit --ckpt_path`` from a checkpoint at the end of the run's ``max_epochs``/``max_steps``: it would train nothing."""


#: what apply_default_threads changed in this process, newest last (main() undoes it when the command ends)
_THREAD_CHANGES: list[tuple[int, str | None]] = []


def draw_seed() -> int:
    """The seed of ``seed_everything: true``: ``PL_GLOBAL_SEED`` when a launcher set it (the processes Lightning
    starts for DDP inherit the first one's), else a random one in ``[0, 2**31)``.

    LightningCLI documents ``true`` as a random seed, but Lightning 2.6's ``seed_everything(None)`` takes 0 when
    ``PL_GLOBAL_SEED`` is unset, so every ``true`` run would be seed 0's.  The seed drawn is written into the
    run's ``config.yaml`` (LightningCLI records the resolved ``seed_everything``).
    """
    env = os.environ.get("PL_GLOBAL_SEED")
    if env not in (None, ""):
        return int(str(env))
    import random

    return random.SystemRandom().randrange(0, 2**31)


class CLOCLightningCLI(LightningCLI):
    """LightningCLI with ``test_after_fit``, exact ``--ckpt_path last`` resume into the same run folder,
    checkpoint/config checks, a prediction writer for ``predict`` and the extra sub-commands in ``--help``."""

    def __init__(self, *pos: Any, **kwargs: Any) -> None:
        self._num_classes_from_checkpoint = False
        #: the run folder this command made (global rank 0), removed again if the command fails before a result
        self._made_run_folder: str | None = None
        self._threads_set = False
        given = kwargs.get("args")
        #: the command line as given (integers of ``--trainer.limit_*_batches`` are read from it)
        self._raw_args = [str(a) for a in given] if isinstance(given, (list, tuple)) else sys.argv[1:]
        kwargs.setdefault("parser_class", CLOCArgumentParser)
        kwargs.setdefault("save_config_callback", RunConfigSaver)
        # the module configures its optimiser (param groups: the CLOC margins' own) and schedule: no
        # --optimizer/--lr_scheduler of LightningCLI, which would replace both (see _check_no_lightning_optimizer_keys)
        kwargs.setdefault("auto_configure_optimizers", False)
        super().__init__(*pos, **kwargs)

    def add_arguments_to_parser(self, parser: Any) -> None:
        parser.add_argument(
            "--test_after_fit",
            type=bool,
            default=False,
            help="After fit, run test on the best checkpoint (or the final weights without one) and print the metrics.",
        )
        # the data -> model contract (cloc_lightning.data_contract): a config names its classes once, on the data module
        parser.link_arguments("data", "model.init_args.num_classes", compute_fn=self.num_classes_from_data, apply_on="instantiate")

    def num_classes_from_data(self, data: Any) -> int | None:
        """The model's ``num_classes`` from the data module (the link ``data -> model.init_args.num_classes``).

        Applied when the data module is built, before the model: a model whose ``num_classes`` is
        required (the classifiers) gets the data module's
        (:attr:`~cloc_lightning.data_contract.DataInfo.num_classes`); one whose ``num_classes`` is
        optional (the pre-training modules' online probe: ``null`` = the data module's, read at
        setup) keeps the value it was given.  A value given anyway (config, command line, or the
        hyper-parameters of a ``--ckpt_path`` checkpoint) must equal the data module's: a
        different one is refused naming both, never replaced silently.
        """
        cfg = self._cfg()
        model_cfg = cfg.get("model")
        args = _run_options_target(model_cfg)
        given = args.get("num_classes") if args is not None else None
        cls = import_class(str(model_cfg.get("class_path") or "")) if model_cfg is not None and hasattr(model_cfg, "get") else None
        if given is None and not (cls is not None and _requires_num_classes(cls)):
            return None
        owner = cls.__name__ if cls is not None else "the model"
        info = DataInfo(data, owner=owner)
        # a data module that knows why its classes may differ says what to do (BaseDataModule.class_mismatch_hint; optional for others)
        hint = getattr(data, "class_mismatch_hint", None)
        extra = (str(hint()) if callable(hint) else "").replace("{", "{{").replace("}", "}}")
        if self._num_classes_from_checkpoint:
            info.check_num_classes(
                given,
                subject=f"--ckpt_path {cfg.get('ckpt_path')}: the checkpoint was trained with num_classes={given},",
                fix="evaluate or resume it on data with {given} classes (the config it was trained with is config.yaml in its run folder)"
                + extra,
            )
        generic = (
            f"{owner} takes num_classes from the data module: leave model.init_args.num_classes "
            "(--model.num_classes) out of the config and the command line, or configure the data module with {given} classes"
        )
        info.check_num_classes(given, fix=extra.removeprefix("; ") or generic)
        return info.num_classes

    def setup_parser(self, add_subcommands: bool, main_kwargs: dict[str, Any], subparser_kwargs: dict[str, Any]) -> None:
        """LightningCLI's parser; a command line that starts with a sub-command builds that sub-command's parser only (each
        holds the Trainer's, the model's and the data module's arguments: building all four took 3/4 of a refused
        command's time).  ``cloc-lightning --help`` and anything else build them all."""
        first = self._raw_args[0] if self._raw_args else None
        every = type(self).subcommands()
        if add_subcommands and first in every:
            self.subcommands = lambda: {first: every[first]}  # type: ignore[method-assign]
        try:
            super().setup_parser(add_subcommands, main_kwargs, subparser_kwargs)
        finally:
            self.__dict__.pop("subcommands", None)
        _first_sentence_summaries(self.parser, self.subcommands())
        extra = "\n".join(f"  {name:<18} {_first_line(fn)}" for name, fn in COMMANDS.items())
        self.parser.epilog = (
            f"other commands (not LightningCLI sub-commands; each has its own --help):\n{extra}\n\n"
            "--debug (anywhere on the command line) shows full tracebacks instead of the short error message."
        )
        self.parser.formatter_class = argparse.RawDescriptionHelpFormatter

    def _cfg(self) -> Any:
        return self.config[self.subcommand] if self.subcommand else self.config

    # ------------------------------------------------------------------ parsing
    def parse_arguments(self, parser: Any, args: Any) -> None:
        """LightningCLI's parsing, with ``seed_everything: true`` drawing a seed (:func:`draw_seed`)."""
        super().parse_arguments(parser, args)
        sub = self.config.get("subcommand")
        cfg = self.config[sub] if sub else self.config
        if cfg.get("seed_everything") is True:
            cfg["seed_everything"] = draw_seed()
        seed = cfg.get("seed_everything")
        if isinstance(seed, int) and not isinstance(seed, bool) and not 0 <= seed < 2**32:
            raise ValueError(f"--seed_everything {seed}: a seed is an integer in [0, 2**32 - 1] (numpy's range), or true for a random one")
        if not isinstance(cfg.get("trainer"), (dict, type(None))) and not hasattr(cfg.get("trainer"), "keys"):
            raise ValueError(f"trainer: a mapping of Trainer settings (max_epochs: 10, ...), got a {type(cfg.get('trainer')).__name__}")

    def _parse_ckpt_path(self) -> None:
        """Refuse a ``--ckpt_path`` of another module class or backbone before Lightning adopts its hyper-parameters.

        Lightning's CLI replaces the configured model by the one recorded in the checkpoint,
        so a checkpoint of another method would silently be tested/resumed instead of the
        configured one.  The speed options (:data:`RUN_OPTIONS`) stay the configured ones: a
        compiled run resumes plain and a plain run compiled, as the command line says.
        """
        sub = self.config.get("subcommand")
        ckpt_path = self.config[sub].get("ckpt_path") if sub else None
        _check_ckpt_path_exists(ckpt_path)
        if ckpt_path and os.path.isfile(ckpt_path):
            check_config_against_checkpoint(self.config[sub].get("model"), ckpt_path)
        kept = _run_options(self.config[sub].get("model")) if sub else {}
        before = _given_num_classes(self.config[sub].get("model")) if sub else None
        super()._parse_ckpt_path()
        after = _given_num_classes(self.config[sub].get("model")) if sub else None
        #: whether the model's num_classes is the --ckpt_path checkpoint's (named in a mismatch with the data module)
        self._num_classes_from_checkpoint = after is not None and after != before
        if kept:  # how this run executes is the command line's / config's, not the checkpoint's
            args = _run_options_target(self.config[sub].get("model"))
            if args is not None:
                for key, value in kept.items():
                    args[key] = value

    def before_instantiate_classes(self) -> None:
        """Refuse a config that still holds ``REQUIRED: ...`` placeholders (:func:`check_required_placeholders`) before anything is built."""
        check_required_placeholders(self._cfg(), self._raw_args)

    def instantiate_trainer(self, **kwargs: Any) -> Any:
        cfg = self.config[self.subcommand] if self.subcommand else self.config
        root = cfg.get("trainer", {}).get("default_root_dir")
        _check_trainer_counts(cfg.get("trainer", {}))
        if root is not None and (not str(root).strip() or os.path.isfile(os.path.expanduser(str(root)))):
            what = "an empty folder name" if not str(root).strip() else "a file, not a folder"
            raise ValueError(f"--trainer.default_root_dir {str(root)!r}: {what}; give the folder runs are written under")
        return super().instantiate_trainer(**{**_integer_batch_limits(cfg, self._raw_args), **kwargs})

    # ------------------------------------------------------------------ subcommands
    def _run_subcommand(self, subcommand: str) -> None:
        """LightningCLI's ``before_<cmd>``, the Trainer command and ``after_<cmd>``; a command that fails before any
        result removes the run folder it made (:meth:`_remove_run_folder_left_empty`) and re-raises."""
        try:
            super()._run_subcommand(subcommand)
        except Exception as e:
            self._remove_run_folder_left_empty(e)
            trainer = getattr(self, "trainer", None)
            # read by the entry point: a refusal of Lightning's own before the first optimiser step is shown as one line
            e.cloc_before_first_step = subcommand == "fit" and trainer is not None and trainer.global_step == 0  # type: ignore[attr-defined]
            raise

    def _remove_run_folder_left_empty(self, exc: BaseException) -> None:
        """Remove the run folder this command made when it holds no result (:func:`_left_empty`: no checkpoint, at
        whatever step it failed), and the logger's name folder above it when that is left empty.  Global rank 0 only (the rank that made it), without collectives: the other ranks may be
        failing elsewhere.  A failure inside ``ddp_spawn`` workers is left alone (their progress is not known here)."""
        import shutil

        from torch.multiprocessing.spawn import ProcessRaisedException

        folder, self._made_run_folder = self._made_run_folder, None
        trainer = getattr(self, "trainer", None)
        if folder is None or trainer is None or not trainer.is_global_zero:
            return
        if isinstance(exc, ProcessRaisedException):
            return
        try:
            if os.path.isdir(folder) and _left_empty(folder):  # no checkpoint yet (the steps' logs alone are no result)
                shutil.rmtree(folder)
                parent = os.path.dirname(folder)
                if os.path.isdir(parent) and not os.listdir(parent):  # the logger's name folder, made for this run alone
                    os.rmdir(parent)
                top = MADE_ABOVE.pop(os.path.abspath(folder), None)  # and the folders above it this command made, if empty
                d = os.path.dirname(os.path.abspath(folder))
                while top is not None and (d == top or d.startswith(top + os.sep)):
                    if os.path.isdir(d):
                        if os.listdir(d):
                            break
                        os.rmdir(d)
                    d = os.path.dirname(d)
        except OSError as e:  # never hide the command's own error
            print(
                f"cloc-lightning: could not remove the run folder {folder} that the failed command made: {e}", file=sys.stderr, flush=True
            )

    def _resolve_ckpt_path(self) -> None:
        """``--ckpt_path last`` -> the run's newest ``last*.ckpt``; a resumed fit logs into the checkpoint's run folder."""
        cfg = self.config_init[self.subcommand]
        given = path = cfg.get("ckpt_path")
        pinned = any(lg._version is not None for lg in _versioned_loggers(self.trainer)[:1])
        if path == "last":
            path = find_last_checkpoint(self.trainer)
            if path is None and self.subcommand != "fit":  # nothing to evaluate: say so, not "training starts from scratch"
                raise FileNotFoundError(
                    f"--ckpt_path last: no last.ckpt of this run to {self.subcommand} (runs are found under the logger's "
                    "save_dir and name); give the checkpoint's path, --ckpt_path <run folder>/checkpoints/last.ckpt"
                )
            if path is None:
                print_line(self.trainer, "--ckpt_path last: no last checkpoint found for this run; training starts from scratch")
            cfg["ckpt_path"] = path
        if path and os.path.isfile(path) and self.subcommand == "fit":
            _check_trains_more(self.trainer, given, path)  # before the run folder and its records are touched
            # a resumed fit continues its run folder (validate/test/predict log into a new one and
            # never overwrite the training run's config.yaml)
            version = _version_folder_of(self.trainer, path)
            if version is not None:
                _pin_logger_version(self.trainer, version)
            info = checkpoint_position(path)
            folder = f"its run folder {version}" if version else "a new run folder (the checkpoint is not in this logger's folders)"
            print_line(self.trainer, f"--ckpt_path {given}: resuming from {path} ({info}); logging into {folder}")
        _pin_logger_version(self.trainer, None)  # fix the folder now: ddp_spawn workers and the main process agree
        resuming = bool(self.subcommand == "fit" and path and os.path.isfile(path))
        for cb in self.trainer.callbacks:  # type: ignore[attr-defined]
            if isinstance(cb, RunConfigSaver):
                cb.resuming = resuming
        # the checks that refuse a run come before its run folder is made: a refused run leaves none
        if self.subcommand != "fit":
            self._require_weights(path)
            key = f"limit_{str(self.subcommand).replace('validate', 'val')}_batches"
            limit = getattr(self.trainer, key, None)
            if isinstance(limit, (int, float)) and not isinstance(limit, bool) and limit == 0:
                raise ValueError(f"--trainer.{key} 0: {self.subcommand} would run on no batch and report nothing; remove it")
        else:
            check_trains_something(self.trainer, type(self.model).__name__)  # again at setup, for Python use
        self._made_run_folder = _claim_run_folder(self.trainer, pinned=pinned, resuming=resuming)

    def _require_weights(self, ckpt_path: str | None) -> None:
        """``validate``/``test``/``predict`` need trained weights: a ``--ckpt_path``, or an ``init_from`` that
        loads every weight the command reads.

        Without either, the model is the randomly initialised one (a ``pretrained`` backbone
        still has an untrained head), and its metrics or predictions would look like results.
        An ``init_from`` checkpoint of another module (a SupCon encoder for a CLOC model, a CE
        model for a CORN one) leaves the head at its initialisation: refused too, naming what
        is missing (:meth:`~cloc_lightning.methods.base.BaseModule.init_from_report` against
        :meth:`~cloc_lightning.methods.base.BaseModule.evaluation_keys`).
        """
        hparams = getattr(self.model, "hparams", None) or {}
        init_from = hparams.get("init_from")
        if ckpt_path:
            return
        sub = self.subcommand
        what = "predictions" if sub == "predict" else "metrics"
        if not init_from:
            raise MissingWeightsError(
                f"{sub} without trained weights: no --ckpt_path and no --model.init_from, so the model is the untrained, "
                f"randomly initialised one and its {what} mean nothing; give --ckpt_path <run folder>/checkpoints/<file>.ckpt "
                "(a checkpoint of this model) or --model.init_from <checkpoint or state_dict file>"
            )
        report = getattr(self.model, "init_from_report", None)
        needed = getattr(self.model, "evaluation_keys", None)
        if not callable(report) or not callable(needed):
            return  # not a BaseModule: its init_from is its own
        loaded = set(report(init_from)["loaded"])
        keys = needed()
        untrained = [k for k in keys if k not in loaded]
        if not untrained:
            return
        name = type(self.model).__name__
        groups = _key_groups(untrained)
        raise MissingWeightsError(
            f"{sub} with --model.init_from {init_from}: {', '.join(groups)} not in it ({len(untrained)} of the {len(keys)} "
            f"tensors {name} evaluates with), so its {what} would come from an untrained {', '.join(groups)}; give "
            f"--ckpt_path <a checkpoint of {name}> (fit first, e.g. with this --model.init_from), or an init_from "
            f"checkpoint of {name}"
        )

    def _before_subcommand(self) -> None:
        """``before_<fit|validate|test|predict>``: resolve ``--ckpt_path``; ``predict`` also writes its predictions;
        torch's intra-op threads fit the cores left by the loader workers (:mod:`cloc_lightning.threads`)."""
        if not self._threads_set:  # once per command (test_after_fit runs test inside fit)
            self._threads_set = True
            changed = apply_default_threads(self.trainer, self.datamodule)
            if changed is not None:
                _THREAD_CHANGES.append(changed)
        self._resolve_ckpt_path()
        self._check_normalization()
        callbacks: list[Any] = self.trainer.callbacks  # type: ignore[attr-defined]  # set by Lightning at runtime, not declared on Trainer
        if self.subcommand == "predict" and not any(isinstance(cb, PredictionWriter) for cb in callbacks):
            callbacks.append(PredictionWriter())

    before_fit = before_validate = before_test = before_predict = _before_subcommand

    def _check_normalization(self) -> None:
        """Warn (once, rank 0) when the data module normalises its inputs differently from what the model's
        pretrained backbone weights were trained with (:func:`cloc_lightning.nn.pretrained.normalization_mismatch`)."""
        backbone = getattr(self.model, "backbone", None)
        if not isinstance(backbone, nn.Module) or self.datamodule is None:
            return
        data = DataInfo(self.datamodule, type(self.model).__name__).normalization
        message = normalization_mismatch(backbone, *(data or (None, None)))
        if message:
            rank_zero_warn(message)

    def after_fit(self) -> None:
        trainer = self.trainer
        ckpt = trainer.checkpoint_callback
        best = getattr(ckpt, "best_model_path", "") if ckpt is not None else ""
        if self._cfg().get("test_after_fit", False) and not trainer.interrupted:
            # decided on rank 0 and broadcast: every rank must test the same weights (another node may not see the file)
            ckpt_path = trainer.strategy.broadcast(best if best and os.path.isfile(best) else None)
            if ckpt_path is None:
                print_line(trainer, "test_after_fit: no best checkpoint was saved; testing the final weights")
            trainer.test(self.model, datamodule=self.datamodule, ckpt_path=ckpt_path)
        self._closing_lines(best)

    def _closing_lines(self, best: str = "") -> None:
        """``logs (<logger>): <run folder>`` (and the best checkpoint after fit), printed by rank 0.

        The logger is named as it writes (``TensorBoard``, ``CSV``, ...: :func:`_logger_names`);
        without one the line says ``run folder (no logger)``.
        """
        trainer = self.trainer
        log_dir = trainer.log_dir  # a broadcast under DDP: every rank must read it, not rank 0 alone
        if trainer.is_global_zero:
            names = _logger_names(trainer)
            if log_dir:
                print(f"logs ({', '.join(names)}): {log_dir}" if names else f"run folder (no logger): {log_dir}")
            if best:
                print(f"best checkpoint: {best}")

    after_validate = after_test = after_predict = _closing_lines


def _first_line(fn: Any) -> str:
    """The ``--help`` summary of a command: the first sentence of its docstring."""
    return _summary(fn)


def _first_sentence_summaries(parser: Any, subcommands: dict[str, Any]) -> None:
    """LightningCLI's sub-command summaries (the first *line* of the Trainer method's docstring) as whole first sentences."""
    import lightning.pytorch as pl

    action = getattr(parser, "_subcommands_action", None)
    for choice in getattr(action, "_choices_actions", []):
        name = getattr(choice, "dest", None) or getattr(choice, "metavar", None)
        fn = getattr(pl.Trainer, str(name), None)
        if name in subcommands and fn is not None:
            choice.help = _summary(fn)


def _check_ckpt_path_exists(ckpt_path: Any) -> None:
    """A local ``--ckpt_path`` file that does not exist: one error line instead of Lightning's traceback."""
    if not ckpt_path or not isinstance(ckpt_path, str) or "://" in ckpt_path:
        return
    if ckpt_path in ("last", "best", "hpc", "registry") or ckpt_path.startswith("registry:"):
        return
    if not os.path.exists(ckpt_path):
        raise FileNotFoundError(
            f"--ckpt_path {ckpt_path}: no such file; give an existing .ckpt file (a run's checkpoints "
            "are in <run folder>/checkpoints/), or --ckpt_path last to continue this run's newest last.ckpt"
        )
    if os.path.isdir(ckpt_path):
        raise IsADirectoryError(
            f"--ckpt_path {ckpt_path}: is a folder; give a .ckpt file in it "
            f"({', '.join(sorted(os.listdir(ckpt_path))[:4]) or 'it is empty'})"
        )


def _check_trains_more(trainer: Any, given: Any, path: str) -> None:
    """Raise :class:`RunFinishedError` when a fit resumed from ``path`` would train nothing: the checkpoint is at the
    end of ``max_epochs`` or ``max_steps`` (Lightning would stop at once, then test and log into the run again)."""
    epochs, step, _ = checkpoint_progress(path)
    max_epochs, max_steps = trainer.max_epochs, trainer.max_steps
    ends, fixes = [], []
    if max_steps is not None and max_steps >= 0 and step >= max_steps:
        ends.append(f"global step {step} of max_steps {max_steps}")
        fixes.append(f"--trainer.max_steps {step + 1} or more")
    if max_epochs is not None and max_epochs >= 0 and epochs >= max_epochs:
        ends.append(f"epoch {epochs} of max_epochs {max_epochs}")
        fixes.append(f"--trainer.max_epochs {epochs + 1} or more")
    if not ends:
        return
    raise RunFinishedError(
        f"--ckpt_path {given}: {path} is the end of its run ({', '.join(ends)}), so this fit would train nothing; to "
        f"train longer give {' and '.join(fixes)} (the learning-rate schedule then spans the new total: docs/cli.md), "
        f"or evaluate it with `cloc-lightning test --ckpt_path {path}` (same config)"
    )


#: Trainer counts Lightning divides by (a 0 was a ZeroDivisionError traceback before the first step): their least value
_TRAINER_MINIMUMS = {"accumulate_grad_batches": 1, "check_val_every_n_epoch": 1, "log_every_n_steps": 1, "max_epochs": -1}


def _check_trainer_counts(trainer: Any) -> None:
    """One line for a Trainer count below the least value Lightning can run (``accumulate_grad_batches 0``, ...)."""
    for key, least in _TRAINER_MINIMUMS.items():
        value = trainer.get(key) if hasattr(trainer, "get") else None
        if isinstance(value, int) and not isinstance(value, bool) and value < least:
            meaning = " (-1 = no limit)" if key == "max_epochs" else ""
            raise ValueError(f"--trainer.{key} {value}: must be an integer >= {least}{meaning}")


def _key_groups(keys: Iterable[str]) -> list[str]:
    """``['head.*', 'probe.*']``: the first name of each ``state_dict`` key, in order."""
    return list(dict.fromkeys(f"{k.split('.', 1)[0]}.*" if "." in k else k for k in keys))


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


_BATCH_LIMITS = ("limit_train_batches", "limit_val_batches", "limit_test_batches", "limit_predict_batches", "val_check_interval")


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
    from cloc_lightning.checkpoints import CheckpointMismatchError, checkpoint_mismatch

    if model_cfg is None or not model_cfg.get("class_path"):
        return
    cls = import_class(str(model_cfg["class_path"]))
    if cls is None:
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
