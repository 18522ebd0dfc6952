"""Generated bad inputs for every option of ``cloc-lightning fit`` (issue 51, items 1 and 4).

Nothing here is listed by hand: the options are read from the signatures the CLI builds its parser from
(``Trainer.__init__``, the shipped modules' and data modules' ``__init__``, LightningCLI's own keys) and each is
given the bad values of its type:

* **wrong type**: a word where a number, a flag, a list or a mapping is expected;
* **near miss**: a choice, a class name or a Trainer setting with one letter wrong (``cpuu``, ``CEModul``);
* **empty**: ``""``;
* **wrong kind of file**: for a file option a missing path, a folder, an empty file and a binary (PNG) file; for a
  folder option a missing path and a file.

:func:`judge` says what a user would: ``good`` when the command stops before the first step with a short error
(at most :data:`MAX_ERROR_LINES` lines, no traceback) naming the option or the path and saying what is wrong, ``silent`` when it runs, and
``buried`` otherwise.  The fast tier runs every case in-process (``tests/cli/test_option_sweep.py``); the audit
(``python -m benchmarks.bad_inputs``) runs them through the command itself.  :data:`ACCEPTED` lists the few values
that are valid settings (each with the reason); a case there must run, not fail.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import os
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: lines an error may take on stderr (the error line, the --debug hint, one more)
MAX_ERROR_LINES = 3
#: (option, value) that are valid settings: run, not refused
ACCEPTED: dict[tuple[str, str], str] = {
    ("--trainer.model_registry", ""): "no registry name: Lightning uploads nothing, as with the default (null)",
}

MODELS = ("CEModule", "CLOCModule", "SupConModule", "ReLICModule", "RnCModule", "OrdinalRegressionModule")
DATA = ("OrdinalShapesDataModule", "CSVDataModule", "ImageFolderDataModule", "UTKFaceDataModule", "CIFAR10DataModule")
#: options the base command sets itself, or that do not apply to a one-process CPU fit, or that only name what to print
SKIP = {
    "--trainer.accelerator",  # covered by near misses below with the base's own value replaced
    "--model.num_classes",  # linked from the data module
    "--data.num_workers",  # the base's own (0: in-process)
    "--trainer.plugins",  # objects, no command-line form
    "--trainer.barebones",
}
#: near misses of Trainer settings that take names (Lightning checks them when the Trainer is built)
TRAINER_NEAR = {
    "--trainer.accelerator": "cpuu",
    "--trainer.strategy": "dpp",
    "--trainer.precision": "16-mix",
    "--trainer.profiler": "simpel",
    "--trainer.gradient_clip_algorithm": "norn",
    "--trainer.logger": "TensorBoardLoger",
    "--trainer.callbacks": "ModelCheckpont",
    "--trainer.devices": "al",
}
BASE_MODEL = ["--model.backbone", "test_resnet"]
BASE_SHAPES = [
    "--data", "OrdinalShapesDataModule", "--data.num_classes", "4", "--data.train_size", "16", "--data.val_size", "8",
    "--data.test_size", "8", "--data.batch_size", "8", "--data.num_workers", "0", "--data.image_size", "16",
]  # fmt: skip
#: one epoch of one training and one validation step, no logger (not fast_dev_run: it overrides the limits, the
#: validation interval and the logger, so their bad values would go unread)
BASE_TRAINER = [
    "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "1", "--trainer.limit_val_batches", "1",
    "--trainer.num_sanity_val_steps", "0", "--trainer.logger", "false", "--trainer.enable_checkpointing", "false",
    "--trainer.accelerator", "cpu", "--trainer.devices", "1",
    "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
]  # fmt: skip
FILE_WORDS = ("path", "csv", "ckpt", "init_from", "learnable_map", "margins", "config", "_file")
DIR_WORDS = ("root", "_dir")
#: folders a run writes into, made when missing
OUTPUT_DIRS = ("default_root_dir", "cache_dir", "save_dir")


@dataclass(frozen=True)
class Case:
    option: str
    kind: str
    value: str
    argv: tuple[str, ...]
    names: tuple[str, ...]
    #: the option's type, as :func:`bad_values` read it (cases of one type, kind and value test one check)
    hint: str = ""

    @property
    def id(self) -> str:
        shown = self.value if len(self.value) < 24 else "…" + self.value[-20:]
        return f"{self.option} {self.kind}: {shown!r}"


def _strip_optional(hint: Any) -> Any:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
        return args[0]
    return hint


def _hints(fn: Any) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except Exception:  # noqa: BLE001 - forward references the module cannot resolve: the raw annotations
        return {n: p.annotation for n, p in inspect.signature(fn).parameters.items()}


def _params(cls: type) -> list[tuple[str, Any, Any]]:
    hints = _hints(cls.__init__)
    out = []
    for name, p in inspect.signature(cls.__init__).parameters.items():
        if name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        out.append((name, hints.get(name, p.annotation), p.default))
    return out


def _near(word: str) -> str:
    """``word`` with one letter wrong: its last letter dropped (a one-letter word gets a letter more)."""
    return word[:-1] if len(word) > 1 else word + "x"


def _file_kinds(work: Path, option: str, folder: bool) -> list[tuple[str, str]]:
    missing = str(work / "no_such" / option.strip("-").replace(".", "_"))
    if folder:
        return [("wrong kind of file", missing), ("wrong kind of file", str(work / "a_file.txt"))]
    return [
        ("wrong kind of file", missing + ".bin"),
        ("wrong kind of file", str(work / "a_folder")),
        ("wrong kind of file", str(work / "empty.bin")),
        ("wrong kind of file", str(work / "image.png")),
    ]


def bad_values(option: str, hint: Any, default: Any, work: Path) -> list[tuple[str, str]]:
    """``(kind, value)`` of every bad input of an option of type ``hint``."""
    leaf = option.rsplit(".", 1)[-1]
    if option in TRAINER_NEAR:
        return [("near miss", TRAINER_NEAR[option]), ("empty", "")]
    if default == "":  # empty is the default value
        return [(kind, value) for kind, value in bad_values(option, hint, None, work) if kind != "empty"]
    hint = _strip_optional(hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        choices = [str(a) for a in args]
        return [("near miss", _near(choices[0])), ("empty", "")]
    if hint is bool:
        return [("wrong type", "maybe"), ("empty", "")]
    if hint in (int, float):
        return [("wrong type", "abc"), ("empty", "")]
    if hint is str:
        near = [("near miss", _near(default))] if isinstance(default, str) and default else []
        if leaf in OUTPUT_DIRS:  # made when missing: only a file in its place is wrong
            return [("wrong kind of file", str(work / "a_file.txt")), ("empty", "")]
        if any(w in leaf for w in DIR_WORDS):
            return [*near, *_file_kinds(work, option, folder=True), ("empty", "")]
        if any(w in leaf for w in FILE_WORDS):
            return [*near, *_file_kinds(work, option, folder=False), ("empty", "")]
        return [*near, ("empty", "")]
    if origin in (tuple, list, dict) or hint in (tuple, list, dict) or "Sequence" in str(hint) or "Mapping" in str(hint):
        return [("wrong type", "abc"), ("empty", "")]
    if origin in (typing.Union, types.UnionType):
        literal = [a for a in args if typing.get_origin(a) is typing.Literal]
        if literal:  # bool | Literal["warn"]: the choice's near miss, and the flag's wrong type
            return [("near miss", _near(str(typing.get_args(literal[0])[0]))), ("wrong type", "maybe"), ("empty", "")]
        if int in args or float in args or "timedelta" in str(hint):
            return [("wrong type", "abc"), ("empty", "")]
        if str in args and any(w in leaf for w in (*DIR_WORDS, *FILE_WORDS)):  # str | Path
            return bad_values(option, str, default, work)
    return []


def _classes() -> tuple[dict[str, type], dict[str, type]]:
    import cloc_lightning.data as data
    import cloc_lightning.methods as methods

    return {n: getattr(methods, n) for n in MODELS}, {n: getattr(data, n) for n in DATA}


def write_fixtures(work: Path) -> None:
    """The files the cases point at: a folder, a text file, an empty and a binary file, and the tiny CSV, image folder
    and UTKFace set of :func:`data_bases`."""
    import numpy as np
    from PIL import Image

    work.mkdir(parents=True, exist_ok=True)
    (work / "a_folder").mkdir(exist_ok=True)
    (work / "a_file.txt").write_text("a file, not a folder\n")
    (work / "empty.bin").write_bytes(b"")
    (work / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    rng = np.random.default_rng(0)

    def jpg(path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(path)

    rows = ["path,label"]
    for i in range(24):
        jpg(work / "csv" / f"{i}.jpg")
        rows.append(f"csv/{i}.jpg,{i % 3}")
    (work / "table.csv").write_text("\n".join(rows) + "\n")
    for split in ("train", "val", "test"):
        for c in ("a", "b"):
            for i in range(4):
                jpg(work / "folder" / split / c / f"{i}.jpg")
    for i in range(24):
        jpg(work / "utk" / f"{10 + 3 * i}_0_0_2017010{i % 9 + 1}.jpg")


def data_bases(work: Path) -> dict[str, list[str]]:
    """A valid ``--data`` part of the command for each data module, on :func:`write_fixtures`' files."""
    common = ["--data.batch_size", "4", "--data.num_workers", "0", "--data.image_size", "16"]
    return {
        "OrdinalShapesDataModule": BASE_SHAPES,
        "CSVDataModule": ["--data", "CSVDataModule", "--data.csv_path", str(work / "table.csv"), *common],
        "ImageFolderDataModule": ["--data", "ImageFolderDataModule", "--data.root", str(work / "folder"), *common],
        "UTKFaceDataModule": ["--data", "UTKFaceDataModule", "--data.root", str(work / "utk"), *common],
        "CIFAR10DataModule": ["--data", "CIFAR10DataModule", *common],
    }


def _without(argv: list[str], option: str) -> list[str]:
    """``argv`` without its own ``option value`` pair (the case gives the option once)."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a == option:
            skip = True
        else:
            out.append(a)
    return out


def _case(option: str, kind: str, value: str, argv: list[str], hint: str = "") -> Case:
    leaf = option.rsplit(".", 1)[-1].lstrip("-")
    names = (leaf,) + ((value,) if kind == "wrong kind of file" else ())
    return Case(option, kind, value, tuple(argv), names, hint)


def representatives(cases: Iterable[Case]) -> list[Case]:
    """The fast tier's share: of the wrong types and empty values of options the parser checks from their type alone
    (numbers, flags, lists), one case per group of options (``--trainer``, ``--model``, ``--data``), type and value;
    every other case (text options, near misses, files: each reaches a check of its own)."""
    seen: set[tuple[str, ...]] = set()
    out = []
    for c in cases:
        group = c.option.split(".", 1)[0] if "." in c.option else c.option
        parsed = c.kind in ("wrong type", "empty") and "str" not in c.hint  # refused by the parser from the type alone
        key = (group, c.kind, c.hint, c.value) if parsed else (c.option, c.value)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def generate(work: Path) -> list[Case]:
    """Every case, for fixtures in ``work`` (:func:`write_fixtures` writes them; nothing is written here)."""
    from lightning.pytorch import Trainer

    bases = data_bases(work)
    models, datas = _classes()
    cases: list[Case] = []
    seen: set[str] = set()

    def add(option: str, values: Iterable[tuple[str, str]], before: list[str], after: list[str] = (), hint: Any = "") -> None:  # type: ignore[assignment]
        if option in seen or (option in SKIP and option not in TRAINER_NEAR):
            return
        seen.add(option)
        before, after = _without(before, option), _without(list(after), option)
        for kind, value in values:
            cases.append(_case(option, kind, value, ["fit", *before, option, value, *after], str(hint)))

    ce = ["--model", "CEModule", *BASE_MODEL]
    # LightningCLI's own keys
    add("--config", [*_file_kinds(work, "--config", folder=False), ("empty", "")], [*ce, *BASE_SHAPES, *BASE_TRAINER])
    add("--seed_everything", [("wrong type", "abc"), ("empty", "")], [*ce, *BASE_SHAPES, *BASE_TRAINER])
    add("--ckpt_path", [*_file_kinds(work, "--ckpt_path", folder=False)], [*ce, *BASE_SHAPES, *BASE_TRAINER])
    add("--model", [("near miss", "CEModul"), ("empty", "")], [], [*BASE_MODEL, *BASE_SHAPES, *BASE_TRAINER])
    add("--data", [("near miss", "OrdinalShapesDataModul"), ("empty", "")], [*ce], [*BASE_TRAINER])
    add("--optimizer", [("near miss", "SG"), ("empty", "")], [*ce, *BASE_SHAPES, *BASE_TRAINER])
    add("--lr_scheduler", [("near miss", "StepL"), ("empty", "")], [*ce, *BASE_SHAPES, *BASE_TRAINER])
    # the Trainer's arguments (the base's own accelerator replaced by the near miss: the option is given once)
    for name, hint, default in _params(Trainer):
        option = f"--trainer.{name}"
        add(option, bad_values(option, hint, default, work), [*ce, *BASE_SHAPES, *BASE_TRAINER], hint=_strip_optional(hint))
    for cname, cls in models.items():
        for name, hint, default in _params(cls):
            option = f"--model.{name}"
            base = ["--model", cname, *(BASE_MODEL if name != "backbone" else [])]
            add(option, bad_values(option, hint, default, work), base, [*BASE_SHAPES, *BASE_TRAINER], _strip_optional(hint))
    for dname, cls in datas.items():
        for name, hint, default in _params(cls):
            option = f"--data.{name}"
            add(option, bad_values(option, hint, default, work), [*ce, *bases[dname]], [*BASE_TRAINER], _strip_optional(hint))
    return cases


# ------------------------------------------------------------------------------------------------- running, judging
@dataclass
class Result:
    code: int
    stderr: str
    stdout: str


def run_in_process(case: Case, cwd: Path) -> Result:
    """``cloc-lightning`` with ``case.argv`` through :func:`cloc_lightning.cli.main` in this process (from ``cwd``)."""
    return run_main(list(case.argv), cwd)


def run_main(argv: list[str], cwd: Path) -> Result:
    """``cloc-lightning <argv>`` through :func:`cloc_lightning.cli.main` in this process, from the folder ``cwd``: its
    exit code (99: an exception escaped, printed as a traceback), stderr and stdout."""
    from cloc_lightning.cli import main

    err, out = io.StringIO(), io.StringIO()
    here = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                main(list(argv))
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except Exception:  # noqa: BLE001 - a traceback is the verdict
                import traceback

                traceback.print_exc(file=err)
                code = 99
    finally:
        os.chdir(here)
    return Result(code, err.getvalue(), out.getvalue())


def error_lines(stderr: str) -> list[str]:
    """The lines from the first ``error:`` line on (warnings printed before it are not the error)."""
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    start = next((i for i, ln in enumerate(lines) if ": error:" in ln or ln.startswith("error:")), None)
    return lines if start is None else lines[start:]


def judge(case: Case, result: Result) -> str:
    """``good``, ``silent`` (it ran) or ``buried`` (a traceback, a long message, or the option and path not named)."""
    if (case.option, case.value) in ACCEPTED:
        return "good" if result.code == 0 else "buried"
    if result.code == 0:
        return "silent"
    if "Traceback (most recent call last)" in result.stderr:
        return "buried"
    lines = error_lines(result.stderr)
    if not lines or len(lines) > MAX_ERROR_LINES:
        return "buried"
    said = lines[0].split("error:", 1)[-1].strip()
    if said.endswith(":") or len(said.split(":", 1)[-1].strip()) < 12:  # a key with no reason after it
        return "buried"
    return "good" if any(name and name in lines[0] for name in case.names) else "buried"
