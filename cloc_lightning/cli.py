"""The ``cloc-lightning`` command: LightningCLI over every registered module and data module.

::

    cloc-lightning fit --config configs/cloc/demo.yaml          # train (+ test with test_after_fit)
    cloc-lightning fit --model CEModule --data UTKFaceDataModule --data.root data/utkface
    cloc-lightning test --config cfg.yaml --ckpt_path runs/.../best.ckpt
    cloc-lightning predict --config cfg.yaml --ckpt_path best.ckpt   # writes predictions.csv
    cloc-lightning fit --help ; cloc-lightning fit --model.help CLOCModule
    cloc-lightning fit --config cfg.yaml --ckpt_path last            # resume the newest last.ckpt of this run

Every subclass of :class:`~cloc_lightning.methods.base.BaseModule` and
:class:`~cloc_lightning.data.base.BaseDataModule` that is imported is selectable by
name with ``--model`` / ``--data`` (or ``class_path`` in YAML), including your
own classes: ``--model my_project.MyCLOC``.  The model's ``num_classes`` comes from the data module
(:meth:`CLOCLightningCLI.num_classes_from_data`, the contract of :mod:`cloc_lightning.data_contract`),
so a config names the classes once, on the data module.  The sub-commands ``probe``, ``export-prototypes`` and
``configs`` (list, show, copy the shipped YAML configs) live in :mod:`cloc_lightning.commands`; the
guide is ``docs/cli.md``.

``--config configs/cloc/demo.yaml`` (or ``-c``, ``--config=...``) where no such file exists, e.g. after
a wheel install outside the repository, uses the config shipped in the package and says so on
stderr (:func:`packaged_config_fallback`).
"""

from __future__ import annotations

import argparse
import copy
import difflib
import os
import re
import sys
from collections.abc import Iterable
from typing import Any, NoReturn

import yaml
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch import nn

import cloc_lightning.data  # registers the data modules (also imported for BaseDataModule below)
import cloc_lightning.methods  # noqa: F401  (registers the modules)
from cloc_lightning._logging import debug_requested, exit_with_error
from cloc_lightning.callbacks import PredictionWriter
from cloc_lightning.callbacks.finite import check_trains_something
from cloc_lightning.callbacks.preemption import SIGTERM_EXIT_CODE
from cloc_lightning.checkpoints import import_class, read_checkpoint
from cloc_lightning.commands import COMMANDS
from cloc_lightning.configs import packaged_config_for
from cloc_lightning.data.base import BaseDataModule
from cloc_lightning.data_contract import DataInfo
from cloc_lightning.distributed import release_process_group
from cloc_lightning.helptext import CLOCHelpFormatter, rst_to_text
from cloc_lightning.methods.base import BaseModule
from cloc_lightning.nn.pretrained import normalization_mismatch
from cloc_lightning.resume import checkpoint_position, checkpoint_progress, find_last_checkpoint
from cloc_lightning.threads import apply_default_threads, restore_threads
from cloc_lightning.validation import invalid_yaml

__all__ = ["CLOCLightningCLI", "CLOCArgumentParser", "RunConfigSaver", "RunFolderInUseError", "MissingWeightsError",
           "RunFinishedError", "main", "packaged_config_fallback", "REQUIRED_MARK",
           "required_placeholders", "check_required_placeholders"]

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


# ---------------------------------------------------------------------------------------------- errors
class RunFolderInUseError(FileExistsError):
    """A new run would write its records into a run folder that already holds another run's."""


class MissingWeightsError(ValueError):
    """``validate``/``test``/``predict`` without trained weights (no ``--ckpt_path``, no ``init_from``)."""


class RunFinishedError(ValueError):
    """``fit --ckpt_path`` from a checkpoint at the end of the run's ``max_epochs``/``max_steps``: it would train nothing."""


class RunFolderError(NotADirectoryError):
    """The logger's ``save_dir`` cannot hold a run folder (a file, or not writable)."""


# ---------------------------------------------------------------------------------------------- help text
def _summary(fn: Any) -> str:
    """The first sentence of ``fn``'s docstring (its first paragraph, joined, up to the first ``. ``)."""
    doc = (getattr(fn, "__doc__", None) or "").strip()
    paragraph = " ".join(line.strip() for line in doc.split("\n\n", 1)[0].splitlines())
    end = re.search(r"[.!?](\s|$)", paragraph)
    return rst_to_text(paragraph[: end.start() + 1] if end else paragraph)


# ---------------------------------------------------------------------------------------------- parser errors
#: LightningCLI's optimiser/scheduler options, which cloc-lightning does not offer (the module configures both)
_LIGHTNING_OPTIM_KEYS = ("optimizer", "lr_scheduler")


def _optimizer_keys_message(given: str) -> str:
    from typing import get_args

    from cloc_lightning.methods.optim import OptimizerName, SchedulerName

    return (
        f"{given}: cloc-lightning has no --optimizer/--lr_scheduler options (LightningCLI's would replace the module's "
        f"optimiser, its parameter groups such as the CLOC margins' and its schedule); set them on the model: "
        f"--model.optimizer {{{','.join(get_args(OptimizerName))}}} --model.lr --model.weight_decay --model.momentum, "
        f"schedule --model.scheduler {{{','.join(get_args(SchedulerName))}}} --model.warmup_epochs --model.min_lr_ratio "
        "--model.lr_milestones --model.lr_gamma --model.lr_interval"
    )


def _check_no_lightning_optimizer_keys(argv: list[str]) -> None:
    """Refuse ``--optimizer ...``/``--lr_scheduler ...`` and top-level ``optimizer:``/``lr_scheduler:`` in ``--config`` files."""
    for arg in argv:
        key = arg.split("=", 1)[0]
        if any(key == f"--{k}" or key.startswith(f"--{k}.") for k in _LIGHTNING_OPTIM_KEYS):
            raise ValueError(_optimizer_keys_message(key))
    for path in _config_paths(argv):
        try:
            with open(path) as f:
                data = yaml.safe_load(f)
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue  # the parser reports unreadable files
        if isinstance(data, dict):
            for k in _LIGHTNING_OPTIM_KEYS:
                if k in data:
                    raise ValueError(_optimizer_keys_message(f"{path}: top-level '{k}:'"))


def _config_paths(argv: list[str]) -> list[str]:
    """The values of ``--config X`` / ``-c X`` / ``--config=X`` on the command line."""
    out = []
    for i, arg in enumerate(argv):
        if arg in ("--config", "-c") and i + 1 < len(argv):
            out.append(argv[i + 1])
        elif arg.startswith("--config="):
            out.append(arg.split("=", 1)[1])
    return out


def _option_names(parser: Any) -> list[str]:
    """Every ``--key`` of ``parser`` (and of its sub-command parsers)."""
    names: list[str] = []
    for action in getattr(parser, "_actions", []):
        names.extend(o for o in action.option_strings if o.startswith("--"))
        for sub in (getattr(action, "choices", None) or {}).values() if isinstance(getattr(action, "choices", None), dict) else ():
            names.extend(_option_names(sub))
    return names


def _class_option_names(class_path: str, prefix: str) -> list[str]:
    """``--<prefix>.<arg>`` for every init argument jsonargparse accepts for ``class_path``."""
    import importlib

    from jsonargparse import ArgumentParser

    module_name, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), name)
        parser = ArgumentParser(exit_on_error=False)
        parser.add_class_arguments(cls, prefix)
    except Exception:  # noqa: BLE001  # only for a suggestion: whatever fails here must not hide the error itself
        return []
    return [o for o in _option_names(parser) if not o.endswith(".help")]


def _initials(name: str) -> str:
    return "".join(part[:1] for part in name.split("_") if part)


def _nearest(key: str, names: Iterable[str]) -> str:
    """``; did you mean --a or --b?`` for the valid keys nearest to ``key`` (spelling, or ``learning_rate`` ~ ``lr``)."""
    pool = sorted(set(names))
    prefix, _, last = key.rpartition(".")
    same_level = [n for n in pool if n.rpartition(".")[0] == prefix]
    leaf = {n: n.rpartition(".")[2] for n in same_level}
    abbreviated = [n for n in same_level if len(last) > 1 and last != leaf[n]
                   and (_initials(last) == leaf[n] or _initials(leaf[n]) == last)]
    close = difflib.get_close_matches(key, pool, n=3, cutoff=0.6)
    found = list(dict.fromkeys(abbreviated + close))[:3]
    return f"; did you mean {' or '.join(found)}?" if found else ""


def _yaml_error(paths: list[str]) -> str | None:
    """``<file>:<line>:<column>: invalid YAML: <problem>`` for the first ``--config`` file that is not valid YAML."""
    for path in paths:
        try:
            with open(path) as f:
                yaml.safe_load(f)
        except yaml.MarkedYAMLError as e:
            return invalid_yaml(path, e)
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
    return None


def _inline_values(argv: list[str]) -> list[tuple[str, str]]:
    """``(option, value)`` for each ``--key value`` / ``--key=value`` whose value is an inline YAML ``{...}`` or ``[...]``."""
    out = []
    for i, arg in enumerate(argv):
        if not arg.startswith("--"):
            continue
        key, eq, value = arg.partition("=")
        if not eq:
            if i + 1 >= len(argv):
                continue
            value = argv[i + 1]
        if key != "--config" and value.lstrip()[:1] in ("{", "["):
            out.append((key, value))
    return out


def _inline_yaml_error(argv: list[str], text: str) -> str | None:
    """``--key:<line>:<column>: invalid YAML: ...`` for an inline ``{...}``/``[...]`` value, of the key the parser refused.

    Only looked at after the parser failed: a ``str`` option takes any text (a checkpoint ``filename`` such as
    ``{epoch}-{step}`` is not YAML), so an inline value that is not YAML is an error only where the parser said so.
    """
    refused = set(re.findall(r'Parser key "([^"]+)"', text)) | set(re.findall(r"--([\w.]+)", text))
    if not refused:
        return None
    for key, value in _inline_values(argv):
        name = key[2:].replace(".init_args.", ".")
        if not any(name == r or name.startswith(r + ".") or r.startswith(name + ".")
                               or r.replace(".init_args.", ".") == name for r in refused):
            continue
        try:
            yaml.safe_load(value)
        except yaml.MarkedYAMLError as e:
            return invalid_yaml(key, e)
        except yaml.YAMLError:
            continue
    return None


def yaml_parse_error(message: str, argv: list[str]) -> str | None:
    """The ``file:line:col: invalid YAML`` line of a parse error caused by YAML syntax (a ``--config`` file or an inline value)."""
    text = " ".join(ln.strip() for ln in message.strip().splitlines() if ln.strip())
    if "Problems parsing config" in text and "<unicode string>" in text:
        found = _yaml_error(_config_paths(argv))
        if found:
            return found
    return _inline_yaml_error(argv, text)


def short_parse_error(message: str, parser: Any, argv: list[str]) -> str:
    """jsonargparse's (often nested, many-line) parse error as one line naming the key, the value and the fix."""
    lines = [ln.strip() for ln in message.strip().splitlines() if ln.strip()]
    text = " ".join(lines)
    found = yaml_parse_error(message, argv)
    if found:
        return found
    m = re.search(r'Parser key "([^"]+)":.*?Problem with given class_path \'([^\']+)\':\s*(.*?)(?:- Expected a|Given value type|$)',
                  text)
    if m:
        key, class_path, inner = m.group(1), m.group(2), m.group(3).strip()
        cls_name = class_path.rsplit(".", 1)[-1]
        bad = re.search(r"Option '([^']+)' is not accepted", inner)
        if bad:
            opt = f"--{key}.{bad.group(1)}"
            return f"{opt}: {cls_name} has no such argument{_nearest(opt, _class_option_names(class_path, key))}"
        sub = re.search(r'Parser key "([^"]+)":\s*(.*)', inner)
        if sub:
            return f"--{key}.{sub.group(1)}: {_plain_type_error(sub.group(2))} ({cls_name})"
        return f"--{key} ({cls_name}): {inner}"
    m = re.search(r"Unrecognized arguments: (.*)", text, flags=re.IGNORECASE)
    if m:
        first = m.group(1).split()[0]
        key = first.split("=", 1)[0]
        return f"unknown option {key}{_nearest(key, _option_names(parser))}"
    m = re.search(r'Parser key "config": File does not exist: (.*)', text)
    if m:
        return f"--config: no such file: {m.group(1)} (`cloc-lightning configs list` names the shipped configs)"
    m = re.search(r"Key '([^']+)' is not expected", text)
    if m:
        key = "--" + m.group(1)
        return f"{lines[0]}{_nearest(key, _option_names(parser))}"
    m = re.search(r'Parser key "([^"]+)":\s*(.*)', text)
    if m and "Does not validate against any of the Union subtypes" not in m.group(2):
        return f"--{m.group(1)}: {_plain_type_error(m.group(2))}"
    return lines[0] if lines else message


def _plain_type_error(text: str) -> str:
    m = re.match(r"Expected a <class '([^']+)'>\. Got value: (.*)", text.strip())
    return f"expected {m.group(1)}, got {m.group(2)!r}" if m else text.strip()


_LINKED_NUM_CLASSES = "linked: the data module's num_classes; a value given must equal it"


def _linked_num_classes(action: argparse.Action) -> argparse.Action:
    """``action`` as the help shows it: the model's ``num_classes`` is not required on the command line.

    The CLI fills it from the data module (:meth:`CLOCLightningCLI.num_classes_from_data`), so
    ``--model.help CEModule`` must not list it as ``(required)``; every other action is returned as is.
    """
    dest = action.dest or ""
    if not (action.required and (dest == "model.init_args.num_classes" or "--model.num_classes" in action.option_strings)):
        return action
    shown = copy.copy(action)
    shown.required = False
    shown.default = argparse.SUPPRESS  # not "default: null": the link gives it
    shown.help = f"{action.help or ''} ({_LINKED_NUM_CLASSES})".strip()
    return shown


class CLOCCLIHelpFormatter(CLOCHelpFormatter):
    """:class:`CLOCHelpFormatter` that shows the model's ``num_classes`` as linked from the data module."""

    def add_usage(self, usage: str | None, actions: Iterable[argparse.Action], groups: Iterable[Any], prefix: str | None = None) -> None:
        super().add_usage(usage, [_linked_num_classes(a) for a in actions], groups, prefix)

    def add_argument(self, action: argparse.Action) -> None:
        super().add_argument(_linked_num_classes(action))


class CLOCArgumentParser(LightningArgumentParser):
    """LightningCLI's parser with plain-text help (:class:`CLOCHelpFormatter`) and short parse errors.

    A parse error is printed as one ``error:`` line naming the key (and, for an unknown key,
    the nearest valid ones) and exits with code 2, as argparse does; ``--debug`` (or
    ``CLOC_LIGHTNING_DEBUG=1``) shows jsonargparse's usage and full message instead.
    """

    #: set by :func:`main` from ``--debug``: print jsonargparse's full message instead of the short one
    full_errors = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", CLOCCLIHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        argv = list(getattr(self, "args", None) or sys.argv[1:])
        if not self.exit_on_error:
            super().error(message, ex)
        if self.full_errors or debug_requested(sys.argv):
            found = yaml_parse_error(message, argv)  # the parser's message calls a YAML text "<unicode string>"
            if found:
                print(f"{found}", file=sys.stderr, flush=True)
            super().error(message, ex)
        parser = getattr(ex, "subcommand_parser", None) or self
        prog = str(getattr(parser, "prog", "cloc-lightning")).replace(" [options]", "")
        short = short_parse_error(message, parser, argv)
        print(f"{prog}: error: {short}\n({prog} --help lists the options; --debug shows the parser's full message)",
              file=sys.stderr, flush=True)
        raise SystemExit(2)


# ---------------------------------------------------------------------------------------------- required settings
#: the start of a config value that must be given: ``"REQUIRED: --model.learnable_map <phase-one run folder>/cloc_margins.yaml"``
#: (the phase-two configs' margins YAML and weights: ``null`` would mean something else, e.g. "all margins learnable")
REQUIRED_MARK = "REQUIRED:"


def required_placeholders(config: Any, prefix: str = "") -> list[tuple[str, str]]:
    """``(key, value)`` of every value of a parsed config (a Namespace or dict) still holding a :data:`REQUIRED_MARK` placeholder."""
    data = config.as_dict() if hasattr(config, "as_dict") else config
    found: list[tuple[str, str]] = []
    if isinstance(data, dict):
        for key, value in data.items():
            found.extend(required_placeholders(value, f"{prefix}{key}."))
    elif isinstance(data, (list, tuple)):
        for i, value in enumerate(data):
            found.extend(required_placeholders(value, f"{prefix}{i}."))
    elif isinstance(data, str) and data.startswith(REQUIRED_MARK):
        found.append((prefix.rstrip("."), data))
    return found


def check_required_placeholders(config: Any, argv: list[str]) -> None:
    """Refuse a run whose config still holds ``REQUIRED: ...`` placeholders (one line: the file, the settings, what to give)."""
    found = required_placeholders(config)
    if not found:
        return
    files = []
    for path in _config_paths(argv):
        try:
            with open(path) as f:
                text = f.read()
        except (OSError, UnicodeDecodeError):
            continue
        if any(value in text for _, value in found):
            files.append(path)
    where = ", ".join(files) if files else "the config"
    keys = ", ".join(key for key, _ in found)
    give = " ".join(value[len(REQUIRED_MARK):].strip() for _, value in found)
    raise ValueError(f"{where}: {keys} {'is a required setting' if len(found) == 1 else 'are required settings'} that "
                     f"this run does not give (the config holds the placeholder {found[0][1]!r}); give {give}")


# ---------------------------------------------------------------------------------------------- run records
_RESUME_RECORD = re.compile(r"^config\.resume-(\d+)\.yaml$")


class RunConfigSaver(SaveConfigCallback):
    """Write the run's config once, into its own run folder, and never over another run's records.

    * A fresh run writes ``config.yaml``; a run folder that already holds one is refused
      (:class:`RunFolderInUseError`: pick another version, or resume with ``--ckpt_path last``).
    * A resumed fit (``fit --ckpt_path``) leaves ``config.yaml`` alone and appends
      ``config.resume-1.yaml``, ``config.resume-2.yaml``, ... (``config.yaml`` if the folder has none).
    * ``validate``/``test``/``predict`` in a folder without a logger version (``--trainer.logger false``)
      append ``config.<command>-N.yaml``.

    Only global rank 0 looks at and writes files; the decision is broadcast.  ``overwrite`` is
    accepted for LightningCLI's ``save_config_kwargs`` and ignored: records are never overwritten.
    """

    def __init__(self, parser: Any, config: Any, config_filename: str = "config.yaml", overwrite: bool = False,
                 multifile: bool = False, save_to_log_dir: bool = True) -> None:
        super().__init__(parser, config, config_filename, overwrite=False, multifile=multifile, save_to_log_dir=save_to_log_dir)
        #: set by the CLI before a ``fit`` that continues a checkpoint
        self.resuming = False
        #: the file written (rank 0), for messages and tests
        self.written: str | None = None

    def record_name(self, log_dir: str, stage: str) -> str:
        """The file this run writes in ``log_dir`` (raises :class:`RunFolderInUseError` for a fresh fit into another run's folder)."""
        fs = get_filesystem(log_dir)
        first = self.config_filename
        if not fs.isfile(os.path.join(log_dir, first)):
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
                name = self.record_name(log_dir, stage)
            except RunFolderInUseError as e:
                problem = str(e)
        name, problem = trainer.strategy.broadcast((name, problem))
        if problem is not None:
            raise RunFolderInUseError(problem)
        if trainer.is_global_zero:
            get_filesystem(log_dir).makedirs(log_dir, exist_ok=True)
            self.written = os.path.join(log_dir, name)
            self.parser.save(self.config, self.written, skip_none=False, overwrite=False, multifile=self.multifile)
            self.save_config(trainer, pl_module, stage)
            self.already_saved = True
        self.already_saved = trainer.strategy.broadcast(self.already_saved)


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
    existing = os.path.abspath(folder)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise RunFolderError(f"logger save_dir: {existing} is a file, not a folder, so {folder} cannot be created; "
                             "give --trainer.logger.init_args.save_dir a folder (e.g. runs)")
    try:
        os.makedirs(folder, exist_ok=True)
        probe = os.path.join(folder, f".cloc-write-test-{os.getpid()}")
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as e:
        raise RunFolderError(f"logger save_dir: cannot write the run folder {folder} ({e.strerror or e}); give "
                             "--trainer.logger.init_args.save_dir a folder you can write to") from None


#: what a run writes into its run folder (other files there, e.g. a scheduler's or job script's own logs, are not a run's records)
_RECORD_PATTERNS = ("config*.yaml", "hparams.yaml", "checkpoints", "events.out.tfevents.*", "metrics.csv",
                    "cloc_margins*", "predictions*.csv", "*.ckpt")


def _run_records(folder: str) -> list[str]:
    """The names in ``folder`` that a run of this library (or Lightning's loggers) writes, sorted."""
    import fnmatch

    return sorted(n for n in os.listdir(folder) if any(fnmatch.fnmatch(n, p) for p in _RECORD_PATTERNS))


#: what a run that failed before its first step may have written into the folder it made (nothing of a result)
_EMPTY_RUN_PATTERNS = ("config*.yaml", "hparams.yaml", "events.out.tfevents.*", "metrics.csv")


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


#: what apply_default_threads changed in this process, newest last (main() undoes it when the command ends)
_THREAD_CHANGES: list[tuple[int, str | None]] = []


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
        n = info.num_classes
        if given is not None and given != n:
            shown = f" ({(info.class_names or [])[:10]})" if info.class_names else ""
            if self._num_classes_from_checkpoint:
                raise ValueError(
                    f"--ckpt_path {cfg.get('ckpt_path')}: the checkpoint was trained with num_classes={given}, but "
                    f"{info.name} has {n} classes{shown}; evaluate or resume it on data with {given} classes (the config "
                    "it was trained with is config.yaml in its run folder)"
                )
            raise ValueError(
                f"model.num_classes={given} but {info.name} has {n} classes{shown}; {owner} takes num_classes from the data "
                f"module: leave model.init_args.num_classes (--model.num_classes) out of the config and the command line, "
                f"or configure the data module with {given} classes"
            )
        return n

    def setup_parser(self, add_subcommands: bool, main_kwargs: dict[str, Any], subparser_kwargs: dict[str, Any]) -> None:
        super().setup_parser(add_subcommands, main_kwargs, subparser_kwargs)
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
        return super().instantiate_trainer(**{**_integer_batch_limits(cfg, self._raw_args), **kwargs})

    # ------------------------------------------------------------------ subcommands
    def _run_subcommand(self, subcommand: str) -> None:
        """LightningCLI's ``before_<cmd>``, the Trainer command and ``after_<cmd>``; a command that fails before any
        result removes the run folder it made (:meth:`_remove_run_folder_left_empty`) and re-raises."""
        try:
            super()._run_subcommand(subcommand)
        except Exception as e:
            self._remove_run_folder_left_empty(e)
            raise

    def _remove_run_folder_left_empty(self, exc: BaseException) -> None:
        """Remove the run folder this command made when it holds no result (:func:`_left_empty`) and no training
        step was taken.  Global rank 0 only (the rank that made it), without collectives: the other ranks may be
        failing elsewhere.  A failure inside ``ddp_spawn`` workers is left alone (their progress is not known here)."""
        import shutil

        from torch.multiprocessing.spawn import ProcessRaisedException

        folder, self._made_run_folder = self._made_run_folder, None
        trainer = getattr(self, "trainer", None)
        if folder is None or trainer is None or not trainer.is_global_zero or trainer.global_step > 0:
            return
        if isinstance(exc, ProcessRaisedException):
            return
        try:
            if os.path.isdir(folder) and _left_empty(folder):
                shutil.rmtree(folder)
        except OSError as e:  # never hide the command's own error
            print(f"cloc-lightning: could not remove the run folder {folder} that the failed command made: {e}",
                  file=sys.stderr, flush=True)

    def _resolve_ckpt_path(self) -> None:
        """``--ckpt_path last`` -> the run's newest ``last*.ckpt``; a resumed fit logs into the checkpoint's run folder."""
        cfg = self.config_init[self.subcommand]
        given = path = cfg.get("ckpt_path")
        pinned = any(lg._version is not None for lg in _versioned_loggers(self.trainer)[:1])
        if path == "last":
            path = find_last_checkpoint(self.trainer)
            if path is None:
                _print0(self.trainer, "--ckpt_path last: no last checkpoint found for this run; training starts from scratch")
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
            _print0(self.trainer, f"--ckpt_path {given}: resuming from {path} ({info}); logging into {folder}")
        _pin_logger_version(self.trainer, None)  # fix the folder now: ddp_spawn workers and the main process agree
        resuming = bool(self.subcommand == "fit" and path and os.path.isfile(path))
        for cb in self.trainer.callbacks:  # type: ignore[attr-defined]
            if isinstance(cb, RunConfigSaver):
                cb.resuming = resuming
        # the checks that refuse a run come before its run folder is made: a refused run leaves none
        if self.subcommand != "fit":
            self._require_weights(path)
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
                _print0(trainer, "test_after_fit: no best checkpoint was saved; testing the final weights")
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


def _logger_names(trainer: Any) -> list[str]:
    """The trainer's loggers as the closing line names them: ``TensorBoardLogger`` -> ``TensorBoard``, ``CSVLogger`` -> ``CSV``."""
    names = []
    for logger in _real_loggers(trainer):
        name = type(logger).__name__
        names.append(name[: -len("Logger")] if name.endswith("Logger") and name != "Logger" else name)
    return list(dict.fromkeys(names))


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
        raise FileNotFoundError(f"--ckpt_path {ckpt_path}: no such file; give an existing .ckpt file (a run's checkpoints "
                                "are in <run folder>/checkpoints/), or --ckpt_path last to continue this run's newest last.ckpt")
    if os.path.isdir(ckpt_path):
        raise IsADirectoryError(f"--ckpt_path {ckpt_path}: is a folder; give a .ckpt file in it "
                                f"({', '.join(sorted(os.listdir(ckpt_path))[:4]) or 'it is empty'})")


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


def _key_groups(keys: Iterable[str]) -> list[str]:
    """``['head.*', 'probe.*']``: the first name of each ``state_dict`` key, in order."""
    return list(dict.fromkeys(f"{k.split('.', 1)[0]}.*" if "." in k else k for k in keys))


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
    for logger in _real_loggers(trainer):
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
                RuntimeError, ImportError, PermissionError)


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
    (:data:`~cloc_lightning.commands.COMMANDS`) alike; ``--debug`` anywhere on the command line (or
    ``CLOC_LIGHTNING_DEBUG=1``) shows the full traceback instead.  A ``--config`` naming a
    shipped config that is not a file here uses the packaged file (:func:`packaged_config_fallback`).
    """
    argv = sys.argv[1:] if args is None else list(args)
    debug = debug_requested(argv)
    argv = [a for a in argv if a != "--debug"]
    try:
        if not argv or argv[0] != "configs":
            argv = packaged_config_fallback(argv)
        if argv and argv[0] in COMMANDS:
            COMMANDS[argv[0]](argv[1:])
            return
        _check_no_lightning_optimizer_keys(argv)
        CLOCArgumentParser.full_errors = debug
        if args is None:  # console use: LightningCLI reads sys.argv (warns when given both)
            sys.argv = sys.argv[:1] + argv
        CLOCLightningCLI(
            BaseModule,
            BaseDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            trainer_defaults=TRAINER_DEFAULTS,
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
    finally:  # on every rank, before the interpreter's exit (where a live gloo group can abort the process)
        release_process_group()
        while _THREAD_CHANGES:  # main() called in a longer-lived process (tests, notebooks): torch's threads as they were
            restore_threads(_THREAD_CHANGES.pop())
