"""``main``: the entry point of ``cloc-lightning``, and the filter that shows the library's own errors as one line."""

from __future__ import annotations

import os
import sys

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

__all__ = ["main", "library_error", "lightning_refusal", "packaged_config_fallback"]


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


def trainer_setting_error(exc: BaseException, argv: list[str]) -> BaseException | None:
    """One line for a Trainer setting Lightning refuses while the Trainer is built: the option named with the value
    given, Lightning's reason and the fix; ``None`` for an error raised anywhere else.

    The accelerator, strategy, device and precision checks say the machine cannot run it; any other check of
    ``Trainer.__init__`` (``gradient_clip_algorithm``, ``profiler``, ...) names the option its message names.
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
    # the last occurrence: the value in effect when an option is given twice
    given = next((argv[i + 1] for i in range(len(argv) - 2, -1, -1) if option and argv[i] == f"--trainer.{option}"), None)
    value = given if given and given.split() == [given] else repr(given)
    shown = f"--trainer.{option} {value}" if given is not None else (f"trainer.{option}" if option else "a Trainer setting")
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
    try:
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
