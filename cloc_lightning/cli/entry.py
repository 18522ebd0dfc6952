"""``main``: the entry point of ``cloc-lightning``, and the filter that shows the library's own errors as one line."""

from __future__ import annotations

import os
import sys
from typing import Any

from jsonargparse import ArgumentError
from lightning.pytorch.utilities.exceptions import SIGTERMException

import cloc_lightning.data  # registers the data modules
import cloc_lightning.methods  # noqa: F401  (registers the modules)
from cloc_lightning._logging import debug_requested, exit_with_error
from cloc_lightning.callbacks.preemption import SIGTERM_EXIT_CODE
from cloc_lightning.cli.commands import COMMANDS
from cloc_lightning.cli.lightning_cli import _THREAD_CHANGES, TRAINER_DEFAULTS, CLOCLightningCLI
from cloc_lightning.cli.parser import (
    CLOCArgumentParser,
    _check_no_lightning_optimizer_keys,
    check_config_files,
    exit_with_parse_error,
    yaml_parse_error,
)
from cloc_lightning.configs import packaged_config_for
from cloc_lightning.data.base import BaseDataModule
from cloc_lightning.distributed import release_process_group
from cloc_lightning.methods.base import BaseModule
from cloc_lightning.threads import restore_threads

__all__ = ["main", "library_error", "lightning_refusal", "packaged_config_fallback", "unknown_command"]


#: exception types whose messages (raised by cloc_lightning) name the fix: shown short, without a traceback
_USER_ERRORS = (
    ValueError,
    TypeError,
    FileNotFoundError,
    NotADirectoryError,
    IsADirectoryError,
    FileExistsError,
    FloatingPointError,
    RuntimeError,
    ImportError,
    PermissionError,
)


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


#: words of Lightning's messages that say which Trainer setting the machine cannot give
_TRAINER_SETTING_WORDS = (
    ("precision", "precision"),
    ("strategy", "strategy"),
    ("devices", "devices"),
    ("device", "devices"),
    ("num_nodes", "num_nodes"),
    ("gpu", "accelerator"),
    ("cuda", "accelerator"),
    ("xla", "accelerator"),
    ("tpu", "accelerator"),
    ("mps", "accelerator"),
    ("accelerator", "accelerator"),
)


#: words of Lightning's other Trainer messages that name no argument: the argument they are about
_TRAINER_MESSAGE_WORDS = (("Timer(duration", "max_time"),)


def _trainer_option_in(reason: str) -> str:
    """The Trainer argument a Lightning message names first (the longest at one place), else the one its words are
    about (:data:`_TRAINER_MESSAGE_WORDS`), else ``""``."""
    import inspect

    from lightning.pytorch import Trainer

    named = [n for n in inspect.signature(Trainer.__init__).parameters if n != "self" and n in reason]
    if named:
        return min(named, key=lambda n: (reason.index(n), -len(n)))
    return next((opt for word, opt in _TRAINER_MESSAGE_WORDS if word in reason), "")


#: what Lightning's ``devices`` takes (``Trainer``'s docstring), for a value of no form it knows
_DEVICES_FORMS = 'devices takes a number (an int > 0, e.g. 2), device indices ([0, 1] or "0,1"), -1 for all of them, or auto'
#: English number words a ``--trainer.devices`` may be given as, and the value meant
_NUMBER_WORDS = {w: i + 1 for i, w in enumerate(["one", "two", "three", "four", "five", "six", "seven", "eight"])} | {"all": -1}


def _given(argv: list[str], option: str) -> str | None:
    """The value of ``--trainer.<option>`` on the command line (the last one: the value in effect), else ``None``."""
    flag = f"--trainer.{option}"
    for i in range(len(argv) - 1, -1, -1):
        if argv[i] == flag and i + 1 < len(argv):
            return argv[i + 1]
        if argv[i].startswith(flag + "="):
            return argv[i].split("=", 1)[1]
    return None


def _devices_form_known(devices: Any) -> bool:
    """Whether ``devices`` has a form Lightning's ``Trainer(devices=...)`` takes (whether the machine has them or not)."""
    import re

    if isinstance(devices, bool):
        return False
    if isinstance(devices, int):
        return devices >= -1
    if isinstance(devices, (list, tuple)):
        return all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in devices)
    if isinstance(devices, str):
        return bool(re.fullmatch(r"\s*(auto|-1|\d+(\s*,\s*\d+)*\s*,?)\s*", devices))
    return False


def _unknown_name(what: str, value: str, names: list[str], shown: str) -> str:
    """``Lightning does not know this <what>; did you mean <near>? (Lightning's choices: ...)``."""
    import difflib

    near = difflib.get_close_matches(value.lower(), names, n=1, cutoff=0.6)
    if near:
        return f"Lightning does not know this {what}; did you mean {near[0]}? (Lightning's choices: {shown})"
    return f"Lightning does not know this {what}; give one of Lightning's choices: {shown}"


def _unknown_trainer_value(values: dict[str, Any]) -> tuple[str, str] | None:
    """``(option, why)`` for a strategy, accelerator or devices value of ``Trainer(...)`` that Lightning does not know
    (a typo, not a limit of the machine), or a ``num_nodes`` below 1; ``values`` are the accelerator connector's
    arguments.  The names are Lightning's registries'."""
    from lightning.pytorch.accelerators import AcceleratorRegistry
    from lightning.pytorch.strategies import StrategyRegistry

    strategy = values.get("strategy")
    if isinstance(strategy, str):
        names = ["auto", *sorted(StrategyRegistry.available_strategies())]
        if strategy.lower() not in names:
            variant = "_find_unused_parameters_"
            shown = ", ".join(n for n in names if variant not in n)
            if any(variant in n for n in names):
                shown += f"; the ddp ones also as <name>{variant}true or <name>{variant}false"
            return "strategy", _unknown_name("strategy", strategy, names, shown)
    accelerator = values.get("accelerator")
    if isinstance(accelerator, str):
        names = ["auto", *sorted({*AcceleratorRegistry.available_accelerators(), "gpu"})]
        if accelerator not in names:
            return "accelerator", _unknown_name("accelerator", accelerator, names, ", ".join(names))
    devices = values.get("devices", "auto")
    if not _devices_form_known(devices):
        word = _NUMBER_WORDS.get(str(devices).strip().lower()) if isinstance(devices, str) else None
        guess = f"; did you mean {word}?" if word is not None else ""
        return "devices", f"Lightning does not know this form of devices{guess} ({_DEVICES_FORMS})"
    num_nodes = values.get("num_nodes", 1)
    if isinstance(num_nodes, int) and num_nodes < 1:
        return "num_nodes", "Lightning's Trainer refuses it: num_nodes is the number of machines, an int > 0 (1 for this one)"
    return None


def _connector_arguments(exc: BaseException) -> dict[str, Any]:
    """The arguments Lightning's accelerator connector was built with, where ``exc`` was raised inside it."""
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_name == "__init__" and code.co_filename.replace(os.sep, "/").endswith("trainer/connectors/accelerator_connector.py"):
            return dict(tb.tb_frame.f_locals)
        tb = tb.tb_next
    return {}


def trainer_setting_error(exc: BaseException, argv: list[str]) -> BaseException | None:
    """One line for a Trainer setting Lightning refuses while the Trainer is built: the option named with the value
    given, Lightning's reason and the fix; ``None`` for an error raised anywhere else.

    A strategy, accelerator or devices value that Lightning does not know (``--trainer.strategy dpp``,
    ``--trainer.devices two``) is named as such, with the nearest of Lightning's names or the forms ``devices``
    takes; the other accelerator, strategy, device and precision refusals say the machine cannot run it; any other
    check of ``Trainer.__init__`` (``gradient_clip_algorithm``, ``profiler``, ...) names the option its message names.
    """
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append((tb.tb_frame.f_code.co_filename.replace(os.sep, "/"), tb.tb_frame.f_code.co_name))
        tb = tb.tb_next
    machine = any(f.endswith("trainer/connectors/accelerator_connector.py") for f, _ in frames)
    if not machine and not any(f.endswith("pytorch/trainer/trainer.py") and name == "__init__" for f, name in frames):
        return None
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    low = reason.lower()
    machine_option = next((opt for word, opt in _TRAINER_SETTING_WORDS if word in low), "accelerator")
    option = machine_option if machine else _trainer_option_in(reason)
    values = _connector_arguments(exc) if machine else {}
    unknown = _unknown_trainer_value(values) if values else None
    if unknown is not None:
        option = unknown[0]
    given = _given(argv, option) if option else None
    value = given if given and given.split() == [given] else repr(given)
    shown = f"--trainer.{option} {value}" if given is not None else (f"trainer.{option}" if option else "a Trainer setting")
    if unknown is not None:
        if given is None:  # from a config file: the value as the Trainer got it
            shown = f"trainer.{option} {values.get(option)!r}"
        return RuntimeError(f"{shown}: {unknown[1]}")
    if not machine:
        return RuntimeError(f"{shown}: Lightning's Trainer refuses it: {reason} (`cloc-lightning fit --help` lists the options)")
    return RuntimeError(
        f"{shown}: this machine cannot run it ({reason}); choose a setting it has, e.g. --trainer.accelerator cpu "
        "--trainer.devices 1 (docs/gpu.md lists the GPU settings)"
    )


def lightning_refusal(exc: BaseException) -> BaseException | None:
    """One line for an error Lightning itself raised while a fit started, before its first optimiser step (a
    ``val_check_interval`` beyond the epoch's batches, a fraction of batches that rounds to none, ...): the option its
    message names, Lightning's reason; ``None`` for anything raised later, or raised by a model's, a data module's or
    any other code than Lightning's (their tracebacks stay)."""
    if not getattr(exc, "cloc_before_first_step", False):
        return None
    tb, last = exc.__traceback__, None
    while tb is not None:
        last, tb = tb, tb.tb_next
    where = last.tb_frame.f_code.co_filename.replace(os.sep, "/") if last is not None else ""
    if "/lightning/" not in where or "/site-packages/" not in where:
        return None
    reason = " ".join(str(exc).split()) or type(exc).__name__
    first = _trainer_option_in(reason)
    option = f"--trainer.{first}: " if first else ""
    return RuntimeError(f"{option}Lightning refused the run before its first step: {reason}")


def loader_worker_error(exc: BaseException) -> BaseException | None:
    """The library's own message from inside a loader worker, which torch re-raises as "Caught X in DataLoader worker
    process N" with the worker's whole traceback as text; ``None`` when the worker's error is not the library's."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        text = str(cur)
        if text.startswith("Caught ") and "in DataLoader worker process" in text and "Original Traceback" in text:
            frames = [ln for ln in text.splitlines() if ln.strip().startswith('File "')]
            package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            last = [ln for ln in text.strip().splitlines() if ln.strip()][-1]
            kind, _, message = last.partition(": ")
            ours = kind.split(".")[-1] in {t.__name__ for t in _USER_ERRORS} or isinstance(cur, _USER_ERRORS)  # torch re-raises the class
            if frames and package in frames[-1] and message and ours:
                return RuntimeError(message)
        cur = cur.__cause__ or cur.__context__
    return None


def _raised_in_package(exc: BaseException) -> bool:
    tb = exc.__traceback__
    last = None
    while tb is not None:
        last = tb
        tb = tb.tb_next
    if last is None:
        return False
    filename = last.tb_frame.f_code.co_filename
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # cloc_lightning/, not cloc_lightning/cli/
    return package in os.path.abspath(filename)


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
            print(
                f"cloc-lightning: --config {value}: no such file here; using the packaged config {cfg.name} ({cfg.path})",
                file=sys.stderr,
                flush=True,
            )
    return out


#: words other tools use for a command of ``cloc-lightning``
_COMMAND_WORDS = {"train": "fit", "eval": "test", "evaluate": "test", "val": "validate", "infer": "predict", "help": "--help"}


def unknown_command(argv: list[str]) -> str | None:
    """The one line for a command line whose first word is no command of ``cloc-lightning`` (``prob``, ``dta``), naming
    the nearest command and all of them; ``None`` when it starts with a command or an option."""
    import difflib

    if not argv or argv[0].startswith("-"):
        return None
    names = [*CLOCLightningCLI.subcommands(), *COMMANDS]
    word = argv[0]
    if word in names:
        return None
    listed = f"(commands: {', '.join(names)}; cloc-lightning --help describes them)"
    if word.lower().endswith((".yaml", ".yml", ".json")):
        return f"unknown command {word!r}: a config file is given with --config, e.g. cloc-lightning fit --config {word} {listed}"
    near = difflib.get_close_matches(word.lower().replace("_", "-"), names, n=1, cutoff=0.6)
    near = near or [n for w, n in _COMMAND_WORDS.items() if word.lower() == w]
    return f"unknown command {word!r}" + (f"; did you mean {near[0]}? " if near else " ") + listed


def main(args: list[str] | None = None) -> None:
    """Entry point of ``cloc-lightning`` and ``python -m cloc_lightning``.

    Errors that the library raises with a message naming the fix are printed as one short
    ``error:`` line (exit code 1), for LightningCLI's sub-commands and the extra ones
    (:data:`~cloc_lightning.cli.commands.COMMANDS`) alike; ``--debug`` anywhere on the command line (or
    ``CLOC_LIGHTNING_DEBUG=1``) shows the full traceback instead.  A ``--config`` naming a
    shipped config that is not a file here uses the packaged file (:func:`packaged_config_fallback`).
    """
    argv = sys.argv[1:] if args is None else list(args)
    debug = debug_requested(argv)
    argv = [a for a in argv if a != "--debug"]
    if argv == ["--version"]:
        from importlib.metadata import version

        print(f"cloc-lightning {version('cloc-lightning')}")
        return
    try:
        unknown = unknown_command(argv)
        if unknown is not None:  # before LightningCLI's "invalid choice", which names its own four sub-commands only
            print(f"cloc-lightning: error: {unknown}", file=sys.stderr, flush=True)
            raise SystemExit(2)
        if not argv or argv[0] != "configs":
            argv = packaged_config_fallback(argv)
        if argv and argv[0] in COMMANDS:
            check_config_files(argv)
            try:
                COMMANDS[argv[0]](argv[1:])
            except BrokenPipeError:  # `cloc-lightning cache list | head`: the reader left; say nothing more
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                raise SystemExit(1) from None
            except ArgumentError as e:  # a command's jsonargparse parser (parse_command_args): one line, as for fit
                parser = getattr(e, "cloc_parser", None)
                if parser is None:
                    raise
                if debug:
                    found = yaml_parse_error(str(e), argv)
                    print(f"{found}\n" if found else "", end="", file=sys.stderr)
                    parser.print_usage(sys.stderr)
                    print(f"error: {e}", file=sys.stderr, flush=True)
                    raise SystemExit(2) from None
                exit_with_parse_error(parser, str(e), argv)
            return
        check_config_files(argv)
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
        print(f"cloc-lightning: SIGTERM received; stopped without finishing (exit code {SIGTERM_EXIT_CODE})", file=sys.stderr, flush=True)
        raise SystemExit(SIGTERM_EXIT_CODE) from e
    except Exception as e:  # re-raised unless it is the library's own message
        err = None if debug else (library_error(e) or loader_worker_error(e) or trainer_setting_error(e, argv) or lightning_refusal(e))
        if err is None:
            raise
        exit_with_error(err)
    finally:  # on every rank, before the interpreter's exit (where a live gloo group can abort the process)
        release_process_group()
        while _THREAD_CHANGES:  # main() called in a longer-lived process (tests, notebooks): torch's threads as they were
            restore_threads(_THREAD_CHANGES.pop())
