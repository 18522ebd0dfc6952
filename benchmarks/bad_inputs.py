"""The newcomer's audit: bad inputs and traps through the real command line, measured.

Each case runs ``python -m cloc_lightning ...`` in a subprocess on tiny generated data (the
built-in shapes data, a folder of JPEGs, a CSV, UTKFace-named files) and records the exit
code, the number of lines the command printed on stderr, the first line that says what went
wrong and the outcome that matters for the case (was a "best" checkpoint or a margins YAML
written, did ``config.yaml`` change, how were ordinal classes ranked), and a verdict computed from
what it observed: ``good`` (refused or warned in one line that names the fix), ``silent`` (exit 0
with a result that is not one) or ``buried`` (the cause is in a traceback or not said).  It exits 1
when any case is not ``good``.  Run it on two
checkouts to get a before/after table::

    python -m benchmarks.bad_inputs                       # this checkout; prints a markdown table
    python -m benchmarks.bad_inputs --repo /tmp/old-tree  # another checkout (its cloc_lightning first on PYTHONPATH)
    python -m benchmarks.bad_inputs --only predict,typo   # cases whose name contains one of these
    python -m benchmarks.bad_inputs --no-generated        # the cases listed here only (not the generated sweep)

Before the cases listed here it runs the generated ones (:mod:`benchmarks.option_sweep`): every option of ``fit``
given a value of the wrong type, a near miss, an empty value and the wrong kind of file, each through the command
in a subprocess (``--jobs`` at once), judged as the fast tier's ``tests/cli/test_option_sweep.py`` judges them.

Nothing here is timed against anything (wall times are shown for ``--help`` only, which the
audit is about).  Used for docs/reliability.md ("Silent wrong results and buried errors").
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
TINY = {"backbone": "test_resnet", "backbone_kwargs": {"channels": [8, 8, 16, 16], "stem_width": 4}}


@dataclass
class Outcome:
    rc: int
    lines: int
    first: str
    seconds: float
    stdout: str
    stderr: str


def _jpeg(path: Path, seed: int, size: int = 24) -> None:
    import numpy as np
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(path)


def _cfg(
    work: Path,
    name: str,
    model: dict[str, Any] | None = None,
    data: dict[str, Any] | None = None,
    trainer: dict[str, Any] | None = None,
    freeze_at: int | None = None,
) -> Path:
    cfg: dict[str, Any] = {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu",
            "devices": 1,
            "max_epochs": 2,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "limit_train_batches": 2,
            "limit_val_batches": 1,
            "limit_test_batches": 1,
            "num_sanity_val_steps": 0,
            "log_every_n_steps": 1,
            "logger": {
                "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                "init_args": {"save_dir": str(work / "runs"), "name": name},
            },
            **(trainer or {}),
        },
        "model": {"class_path": "cloc_lightning.methods.CLOCModule", "init_args": {"num_classes": 4, **TINY, **(model or {})}},
        "data": data
        or {
            "class_path": "cloc_lightning.data.OrdinalShapesDataModule",
            "init_args": {
                "num_classes": 4,
                "train_size": 32,
                "val_size": 8,
                "test_size": 8,
                "batch_size": 8,
                "num_workers": 0,
                "image_size": 32,
            },
        },
    }
    if freeze_at is not None:
        cfg["trainer"]["callbacks"] = [
            {"class_path": "cloc_lightning.callbacks.CLOCMarginFreeze", "init_args": {"freeze_at_epoch": freeze_at}}
        ]
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def _csv_data(
    work: Path, labels: list[str], missing: int = 0, task: str = "ordinal", class_names: list[str] | None = None
) -> dict[str, Any]:
    rows = []
    for i, label in enumerate(labels):
        p = work / "csvimg" / f"{i}.jpg"
        if i >= missing:
            _jpeg(p, i)
        rows.append({"path": str(p), "label": label, "split": ("train", "val", "test")[i % 3]})
    path = work / f"data_{len(labels)}_{missing}_{abs(hash(tuple(labels))) % 10**6}.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["path", "label", "split"])
        w.writeheader()
        w.writerows(rows)
    args: dict[str, Any] = {
        "csv_path": str(path),
        "split_column": "split",
        "task": task,
        "batch_size": 4,
        "num_workers": 0,
        "image_size": 24,
    }
    if class_names:
        args["class_names"] = class_names
    return {"class_path": "cloc_lightning.data.CSVDataModule", "init_args": args}


class Audit:
    def __init__(self, repo: Path, work: Path) -> None:
        self.repo = repo
        self.work = work
        self.env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="2")  # warnings shown, as users see them
        self.env["PYTHONPATH"] = str(repo) + os.pathsep + self.env.get("PYTHONPATH", "")

    def cli(self, *args: str, timeout: int = 600) -> Outcome:
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "cloc_lightning", *args], cwd=self.work, env=self.env, capture_output=True, text=True, timeout=timeout
        )
        seconds = time.perf_counter() - start
        err = proc.stderr.strip().splitlines()
        hits = [ln for ln in err if re.search(r"error|Error|refus|SIGTERM", ln)]
        return Outcome(proc.returncode, len(err), (hits[0] if hits else (err[-1] if err else ""))[:160], seconds, proc.stdout, proc.stderr)

    def trained(self, name: str, extra: tuple[str, ...] = (), **kw: Any) -> Path:
        """A finished 2-epoch fit; returns its last.ckpt."""
        out = self.cli("fit", "--config", str(_cfg(self.work, name, **kw)), *extra)
        assert out.rc == 0, out.stderr[-2000:]
        return sorted((self.work / "runs" / name).glob("version_*/checkpoints/last.ckpt"))[-1]


def _refusal(o: Outcome) -> str:
    """The verdict of a case that must be refused: ``silent`` when it exits 0, ``buried`` when the cause is in a
    traceback or no line says what went wrong, else ``good``."""
    if o.rc == 0:
        return "silent"
    return "buried" if "Traceback (most recent call last)" in o.stderr or not o.first else "good"


def _fmt(o: Outcome, note: str = "", verdict: str | None = None) -> dict[str, Any]:
    """A table row; ``verdict`` defaults to :func:`_refusal` (the case expects a one-line refusal)."""
    return {
        "rc": o.rc,
        "stderr lines": o.lines,
        "says": o.first.replace("|", "/"),
        "outcome": note,
        "verdict": verdict if verdict is not None else _refusal(o),
    }


def _run_dir(work: Path, name: str) -> Path:
    found = sorted((work / "runs" / name).glob("version_*"))
    return found[-1] if found else work / "runs" / name / "version_0"


# --------------------------------------------------------------------------------------------- cases
def case_predict_without_weights(a: Audit) -> dict[str, Any]:
    for i in range(4):
        _jpeg(a.work / "pred" / f"p{i}.jpg", i)
    o = a.cli("predict", "--config", str(_cfg(a.work, "pred")), "--data.init_args.predict_root", str(a.work / "pred"))
    wrote = list((a.work / "runs" / "pred").glob("version_*/predictions.csv"))
    return _fmt(o, "predictions.csv written" if wrote else "no predictions written", "silent" if wrote else None)


def case_csv_non_integer_label(a: Audit) -> dict[str, Any]:
    labels = [str(i % 12) for i in range(36)] + ["2.5"]
    o = a.cli(
        "fit",
        "--config",
        str(_cfg(a.work, "csv25", model={"num_classes": 13}, data=_csv_data(a.work, labels))),
        "--trainer.max_epochs",
        "1",
    )
    return _fmt(o, "trained" if o.rc == 0 else "stopped")


def case_string_labels_ordinal(a: Audit) -> dict[str, Any]:
    labels = ["young", "adult", "old"] * 6
    o = a.cli(
        "fit",
        "--config",
        str(_cfg(a.work, "strlab", model={"num_classes": 3}, data=_csv_data(a.work, labels))),
        "--trainer.max_epochs",
        "1",
    )
    return _fmt(o, "trained (alphabetical ranks)" if o.rc == 0 else "stopped")


def case_folder_natural_order(a: Audit) -> dict[str, Any]:
    folders = ["0-3", "4-7", "8-14", "15-24"]
    for split in ("train", "val", "test"):
        for c, name in enumerate(folders):
            for i in range(3):
                _jpeg(a.work / "agefolders" / split / name / f"{i}.jpg", 10 * c + i)
    code = (
        "from cloc_lightning.data import ImageFolderDataModule as D; "
        f"d=D(root={str(a.work / 'agefolders')!r}, task='ordinal', batch_size=2, num_workers=0, image_size=24); "
        "d.setup('fit'); print(list(d.class_names))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=a.work, env=a.env, capture_output=True, text=True, timeout=300)
    order = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr.strip().splitlines()[-1]
    return {
        "rc": proc.returncode,
        "stderr lines": len(proc.stderr.strip().splitlines()),
        "says": "",
        "outcome": f"ranks {order}",
        "verdict": "good" if order == str(folders) else "silent",
    }


def case_diverged_run(a: Audit) -> dict[str, Any]:
    o = a.cli("fit", "--config", str(_cfg(a.work, "diverged", model={"lr": 1e8}, freeze_at=1)), "--test_after_fit", "true")
    run = _run_dir(a.work, "diverged")
    best = list(run.glob("checkpoints/best*.ckpt"))
    margins = run / "cloc_margins.yaml"
    note = f"best ckpt {'written' if best else 'none'}; margins YAML {'written' if margins.exists() else 'none'}"
    return _fmt(o, note, "silent" if best or margins.exists() else None)


def case_failed_resume_keeps_config(a: Audit) -> dict[str, Any]:
    a.trained("records")
    run = _run_dir(a.work, "records")
    before = (run / "config.yaml").read_text()
    # the model's class count does not match the data: since the CLI links num_classes from the data module this
    # is refused before any record is written (tests/cli/test_cli_records.py fails a resume later, after them)
    o = a.cli("fit", "--config", str(_cfg(a.work, "records")), "--ckpt_path", "last", "--data.init_args.num_classes", "5")
    after = (run / "config.yaml").read_text()
    extra = sorted(p.name for p in run.glob("config*.yaml"))
    return _fmt(o, f"config.yaml {'unchanged' if before == after else 'OVERWRITTEN'}; {extra}", None if before == after else "silent")


def case_second_run_same_version(a: Audit) -> dict[str, Any]:
    a.trained("pinned", extra=("--trainer.logger.init_args.version", "0"))
    run = a.work / "runs" / "pinned" / "version_0"
    before = (run / "config.yaml").read_text()
    o = a.cli("fit", "--config", str(_cfg(a.work, "pinned")), "--trainer.logger.init_args.version", "0", "--model.init_args.lr", "0.01")
    after = (run / "config.yaml").read_text()
    return _fmt(o, f"first run's config.yaml {'unchanged' if before == after else 'OVERWRITTEN'}", None if before == after else "silent")


def case_optimizer_option(a: Audit) -> dict[str, Any]:
    o = a.cli("fit", "--config", str(_cfg(a.work, "optim")), "--optimizer", "SGD", "--optimizer.lr", "0.5", "--trainer.max_epochs", "1")
    return _fmt(o, "trained with SGD (module optimiser replaced)" if o.rc == 0 else "stopped")


def case_max_epochs_0(a: Audit) -> dict[str, Any]:
    o = a.cli("fit", "--config", str(_cfg(a.work, "noepochs")), "--trainer.max_epochs", "0", "--test_after_fit", "true")
    return _fmt(o, "ran (tested the untrained model)" if o.rc == 0 else "stopped")


def case_limit_train_batches_0(a: Audit) -> dict[str, Any]:
    o = a.cli("fit", "--config", str(_cfg(a.work, "nobatches")), "--trainer.limit_train_batches", "0")
    return _fmt(o, "ran" if o.rc == 0 else "stopped")


def case_freeze_beyond_max_epochs(a: Audit) -> dict[str, Any]:
    o = a.cli("fit", "--config", str(_cfg(a.work, "latefreeze", freeze_at=5)), "--trainer.max_epochs", "1")
    warned = any("freeze_at_epoch" in ln and "max_epochs" in ln for ln in (o.stderr + o.stdout).splitlines())
    return _fmt(o, f"{'said so' if warned else 'silent'} (phase two never reached)", "good" if warned else "silent")


def case_csv_missing_image(a: Audit) -> dict[str, Any]:
    labels = [str(i % 4) for i in range(24)]
    o = a.cli(
        "fit",
        "--config",
        str(_cfg(a.work, "csvmiss", data=_csv_data(a.work, labels, missing=1))),
        "--trainer.max_epochs",
        "1",
        "--trainer.limit_train_batches",
        "1",
    )
    return _fmt(o, "trained (missing file not reached)" if o.rc == 0 else "stopped")


def case_utkface_ages_clipped(a: Audit) -> dict[str, Any]:
    for i, age in enumerate([3, 10, 25, 40, 60, 95, 100, 110] * 3):
        _jpeg(a.work / "utk" / f"{age}_0_0_2017{i:08d}.jpg", i)
    # raw ages 1..80 as 80 classes (label_mode: age): 95, 100 and 110 are clipped into the class '80'
    data = {
        "class_path": "cloc_lightning.data.UTKFaceDataModule",
        "init_args": {"root": str(a.work / "utk"), "label_mode": "age", "batch_size": 4, "num_workers": 0, "image_size": 24},
    }
    o = a.cli(
        "fit",
        "--config",
        str(_cfg(a.work, "utk", model={"num_classes": 80}, data=data)),
        "--trainer.max_epochs",
        "1",
        "--trainer.limit_train_batches",
        "1",
    )
    counted = any("clip" in ln and re.search(r"\d+ above", ln) for ln in (o.stderr + o.stdout).splitlines())
    return _fmt(o, "clipped ages counted" if counted else "clipped silently", "good" if counted else "silent")


def case_16bit_png(a: Audit) -> dict[str, Any]:
    import numpy as np
    from PIL import Image

    path = a.work / "png16" / "x.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    values = (np.arange(64 * 64).reshape(64, 64) * 16).astype(np.uint16)  # a 16-bit ramp over the full range
    Image.fromarray(values).save(path)
    true = float((np.round(values / 257.0) >= 250).mean())
    code = (
        "try:\n    from cloc_lightning.data.datasets import ImageFileDataset as D\n"
        "except ImportError:  # a checkout from before data/base.py was split\n"
        "    from cloc_lightning.data.base import ImageFileDataset as D\n"
        "import torch; import numpy as np; "
        f"x=np.asarray(D([{str(path)!r}], [0]).load(0)); print(float((x >= 250).mean()))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=a.work, env=a.env, capture_output=True, text=True, timeout=300)
    share = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr.strip()[-200:]
    try:
        verdict = "good" if abs(float(share) - true) < 0.01 else "silent"
    except ValueError:
        verdict = "buried"
    return {
        "rc": proc.returncode,
        "stderr lines": 0,
        "says": "",
        "verdict": verdict,
        "outcome": f"share of pixels >= 250: {share} (the ramp's true share: {true:.3f})",
    }


def _one_line_case(*args: str) -> Callable[[Audit], dict[str, Any]]:
    def run(a: Audit) -> dict[str, Any]:
        o = a.cli(*[s.replace("{work}", str(a.work)).replace("{cfg}", str(_cfg(a.work, "base"))) for s in args])
        return _fmt(o)

    return run


def case_init_from_yaml(a: Audit) -> dict[str, Any]:
    (a.work / "m.yaml").write_text("learnable_map:\n- [fixed, 0.5]\n- [fixed, 0.5]\n- [fixed, 0.5]\n")
    return _fmt(a.cli("fit", "--config", str(_cfg(a.work, "base")), "--model.init_args.init_from", str(a.work / "m.yaml")))


def case_image_size_0(a: Audit) -> dict[str, Any]:
    labels = [str(i % 4) for i in range(24)]
    return _fmt(a.cli("fit", "--config", str(_cfg(a.work, "size0", data=_csv_data(a.work, labels))), "--data.init_args.image_size", "0"))


def case_save_dir_not_a_folder(a: Audit) -> dict[str, Any]:
    (a.work / "afile").write_text("x")
    return _fmt(a.cli("fit", "--config", str(_cfg(a.work, "base")), "--trainer.logger.init_args.save_dir", str(a.work / "afile")))


def case_yaml_syntax_error(a: Audit) -> dict[str, Any]:
    (a.work / "broken.yaml").write_text("model:\n  class_path: cloc_lightning.methods.CLOCModule\n  init_args: {num_classes: 4\n")
    return _fmt(a.cli("fit", "--config", str(a.work / "broken.yaml")))


def case_validate_other_class_count(a: Audit) -> dict[str, Any]:
    ckpt = a.trained(
        "eight",
        model={"num_classes": 8},
        data={
            "class_path": "cloc_lightning.data.OrdinalShapesDataModule",
            "init_args": {
                "num_classes": 8,
                "train_size": 32,
                "val_size": 8,
                "test_size": 8,
                "batch_size": 8,
                "num_workers": 0,
                "image_size": 32,
            },
        },
    )
    cfg = _cfg(
        a.work,
        "five",
        model={"num_classes": 5},
        data={
            "class_path": "cloc_lightning.data.OrdinalShapesDataModule",
            "init_args": {
                "num_classes": 5,
                "train_size": 32,
                "val_size": 8,
                "test_size": 8,
                "batch_size": 8,
                "num_workers": 0,
                "image_size": 32,
            },
        },
    )
    return _fmt(a.cli("validate", "--config", str(cfg), "--ckpt_path", str(ckpt)))


def case_help_time(a: Audit) -> dict[str, Any]:
    times = []
    for _ in range(3):
        o = a.cli("fit", "--help")
        times.append(o.seconds)
    return {
        "rc": o.rc,
        "stderr lines": o.lines,
        "says": "",
        "verdict": "good" if o.rc == 0 else "buried",
        "outcome": f"{min(times):.1f} s (min of 3; median {sorted(times)[1]:.1f} s)",
    }


def case_probe_help(a: Audit) -> dict[str, Any]:
    o = a.cli("probe", "--help")
    lam = "<lambda>" in o.stdout
    return {
        "rc": o.rc,
        "stderr lines": o.lines,
        "says": "",
        "verdict": "buried" if lam or o.rc else "good",
        "outcome": "shows '<function … <lambda>>'" if lam else "no lambda reprs",
    }


def case_model_help_rest(a: Audit) -> dict[str, Any]:
    o = a.cli("fit", "--model.help", "CLOCModule")
    raw = len(re.findall(r":(class|func|meth|attr):|``", o.stdout))
    return {
        "rc": o.rc,
        "stderr lines": o.lines,
        "says": "",
        "verdict": "buried" if raw or o.rc else "good",
        "outcome": f"{raw} raw reST markups",
    }


# ---- issue 42 (round 2), items 3, 4, 5, 13: each case also returns a "verdict" computed from what it observed
def _error_lines(o: Outcome) -> list[str]:
    return [ln for ln in o.stderr.splitlines() if "error:" in ln]


def _verdict(o: Outcome, good: bool) -> str:
    """``silent``: exit 0 without the expected message; ``good``: ``good`` holds (one line naming the fix); else ``buried``."""
    if good:
        return "good"
    return "silent" if o.rc == 0 else "buried"


def _refused_in_one_line(o: Outcome, *needles: str) -> bool:
    """Exit != 0, one ``error:`` line holding every needle, no traceback."""
    lines = _error_lines(o)
    return o.rc != 0 and len(lines) == 1 and "Traceback" not in o.stderr and all(n in lines[0] for n in needles)


def case_phase2_without_margins(a: Audit) -> dict[str, Any]:
    o = a.cli(
        "fit",
        "--config",
        str(a.repo / "configs" / "cloc" / "demo_phase2.yaml"),
        "--model.backbone",
        "test_resnet",
        "--data.train_size",
        "32",
        "--data.val_size",
        "8",
        "--data.test_size",
        "8",
        "--data.batch_size",
        "8",
        "--data.num_workers",
        "0",
        "--trainer.max_epochs",
        "1",
        "--trainer.limit_train_batches",
        "2",
        "--trainer.limit_val_batches",
        "1",
        "--test_after_fit",
        "false",
        "--trainer.accelerator",
        "cpu",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.logger.init_args.save_dir",
        str(a.work / "runs"),
    )
    good = _refused_in_one_line(o, "demo_phase2.yaml", "learnable_map", "cloc_margins.yaml")
    note = "trained phase one again (all margins learnable)" if o.rc == 0 else "stopped"
    return {**_fmt(o, note), "verdict": _verdict(o, good)}


def case_utkface_ages_0_and_250_bins(a: Audit) -> dict[str, Any]:
    for i, age in enumerate([0, 3, 10, 25, 40, 60, 95, 250] * 3):
        _jpeg(a.work / "utk" / f"{age}_0_0_2017{i:08d}.jpg", i)
    data = {
        "class_path": "cloc_lightning.data.UTKFaceDataModule",
        "init_args": {"root": str(a.work / "utk"), "batch_size": 4, "num_workers": 0, "image_size": 24},
    }  # label_mode: bins (default)
    o = a.cli(
        "fit",
        "--config",
        str(_cfg(a.work, "utkbins", model={"num_classes": 8}, data=data)),
        "--trainer.max_epochs",
        "1",
        "--trainer.limit_train_batches",
        "1",
    )
    said = _refused_in_one_line(o, "6 UTKFace file(s)", "outside 1..116", "age_range", "strict_names")
    return {**_fmt(o, "binned silently (250 -> 60+, 0 -> 0-3)" if o.rc == 0 else "stopped"), "verdict": _verdict(o, said)}


def _one_class_folder(a: Audit, *extra: str) -> dict[str, Any]:
    for split in ("train", "test"):
        for i in range(3):
            _jpeg(a.work / "one" / split / "cats" / f"{i}.jpg", i)
    o = a.cli(
        "fit",
        "--model",
        "CEModule",
        "--model.backbone",
        "test_resnet",
        *extra,
        "--data",
        "ImageFolderDataModule",
        "--data.root",
        str(a.work / "one"),
        "--data.num_workers",
        "0",
        "--trainer.max_epochs",
        "1",
        "--trainer.logger.init_args.save_dir",
        str(a.work / "runs"),
    )
    lines = _error_lines(o)
    first = lines[0] if lines else ""
    blames = "num_classes must be" in first or "model.num_classes=" in first  # a setting the user never made
    good = _refused_in_one_line(o, "found 1 class(es)", "at least 2 are needed") and not blames
    return {**_fmt(o, "blames num_classes" if blames else "names the data"), "verdict": _verdict(o, good)}


def case_one_class_folder(a: Audit) -> dict[str, Any]:
    return _one_class_folder(a)


def case_one_class_folder_num_classes_2(a: Audit) -> dict[str, Any]:
    return _one_class_folder(a, "--model.num_classes", "2")


#: the UTKFace fit the evaluation cases share (made by the first that needs it; the audit's temporary folder outlives it)
_UTK_RUN: dict[str, Path] = {}


def _utk_trained(a: Audit) -> dict[str, Path]:
    if not _UTK_RUN or not _UTK_RUN["ckpt"].is_file():
        root = a.work / "utk_train"
        for i, age in enumerate([2, 6, 10, 20, 30, 40, 52, 70] * 6):
            _jpeg(root / f"{age}_0_0_2016{i:08d}.jpg", i)
        data = {
            "class_path": "cloc_lightning.data.UTKFaceDataModule",
            "init_args": {"root": str(root), "batch_size": 4, "num_workers": 0, "image_size": 24},
        }
        ckpt = a.trained("utkown", model={"num_classes": 8}, data=data)
        _UTK_RUN.update(root=root, ckpt=ckpt)
    return _UTK_RUN


def _eval_cfg(a: Audit, name: str, **data_args: Any) -> Path:
    data = {
        "class_path": "cloc_lightning.data.UTKFaceDataModule",
        "init_args": {"batch_size": 4, "num_workers": 0, "image_size": 24, **data_args},
    }
    csv_logger = {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(a.work / "runs"), "name": name}}
    return _cfg(a.work, name, model={"num_classes": 8}, data=data, trainer={"logger": csv_logger, "limit_test_batches": 1.0})


def _table(stdout: str) -> dict[str, str]:
    return dict(re.findall(r"^\W*((?:test|val|train)/\S+)\s+\W*\s*([-\d.e+na]+)", stdout, flags=re.MULTILINE))


def case_test_on_own_folder_without_root(a: Audit) -> dict[str, Any]:
    run = _utk_trained(a)
    for i, age in enumerate([3, 7, 12, 22, 33, 44, 55, 66, 77, 88]):
        _jpeg(a.work / "site2" / f"{age}_1_0_2019{i:08d}.jpg", 900 + i)
    o = a.cli("test", "--config", str(_eval_cfg(a, "site2", test_root=str(a.work / "site2"))), "--ckpt_path", str(run["ckpt"]))
    scored = _table(o.stdout).get("test/images")
    good = o.rc == 0 and scored is not None and float(scored) == 10
    return {**_fmt(o, f"scored {scored} images" if o.rc == 0 else "refused (data.root required)"), "verdict": _verdict(o, good)}


def case_test_folder_copies_of_training_faces(a: Audit) -> dict[str, Any]:
    run = _utk_trained(a)
    code = (
        "from cloc_lightning.data import UTKFaceDataModule as D; "
        f"d=D({str(run['root'])!r}, num_workers=0); print('\\n'.join(d._ensure_base()['train'].files))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=a.work, env=a.env, capture_output=True, text=True, timeout=300)
    train = [ln for ln in proc.stdout.splitlines() if ln.endswith(".jpg")]
    import shutil

    (a.work / "dup").mkdir()
    for i, src in enumerate(train[:26]):  # byte-identical copies under other names and ages
        shutil.copy(src, a.work / "dup" / f"{(i % 80) + 5}_1_1_2020{i:08d}.jpg")
    for i in range(4):
        _jpeg(a.work / "dup" / f"{30 + i}_0_1_2021{i:08d}.jpg", 700 + i)
    o = a.cli(
        "test", "--config", str(_eval_cfg(a, "dup", root=str(run["root"]), test_root=str(a.work / "dup"))), "--ckpt_path", str(run["ckpt"])
    )
    warned = [ln for ln in o.stderr.splitlines() if "training split" in ln and "26 of 30" in ln and "26 byte-identical" in ln]
    good = o.rc == 0 and len(warned) == 1
    return {**_fmt(o, "warned with the count" if warned else "scored silently as held-out faces"), "verdict": _verdict(o, good)}


def case_predict_utkface_folder_targets(a: Audit) -> dict[str, Any]:
    run = _utk_trained(a)
    for i, age in enumerate([3, 7, 12, 22, 33, 44]):
        _jpeg(a.work / "named" / f"{age}_1_0_2019{i:08d}.jpg", 800 + i)
    o = a.cli(
        "predict",
        "--config",
        str(_eval_cfg(a, "pred", root=str(run["root"]), predict_root=str(a.work / "named"))),
        "--ckpt_path",
        str(run["ckpt"]),
    )
    found = list((a.work / "runs" / "pred").glob("version_*/predictions.csv"))
    header = found[0].read_text().splitlines()[0].split(",") if found else []
    good = o.rc == 0 and "target" in header
    return {**_fmt(o, "target column written" if "target" in header else "no target column"), "verdict": _verdict(o, good)}


def case_test_table_and_closing_line(a: Audit) -> dict[str, Any]:
    run = _utk_trained(a)
    o = a.cli("test", "--config", str(_eval_cfg(a, "table", root=str(run["root"]))), "--ckpt_path", str(run["ckpt"]))
    table = _table(o.stdout)
    val_rows = [k for k in table if k.startswith("val/")]
    closing = [ln for ln in o.stdout.splitlines() if ln.startswith(("logs (", "run folder ("))]
    good = o.rc == 0 and "test/images" in table and not val_rows and bool(closing) and closing[-1].startswith("logs (CSV)")
    note = (
        f"table: {len(val_rows)} val/* rows, images {'counted' if 'test/images' in table else 'not counted'}; "
        f"closing: {closing[-1].split(':')[0] if closing else 'none'}"
    )
    return {**_fmt(o, note), "verdict": _verdict(o, good)}


# --------------------------------------------------------------------------------------------- issue 42 round 2: items 6, 7, 8, 10, 11
# Each returns a "verdict" computed from what it observed: "good" (refused or warned with one line naming the
# fix), "silent" (exit 0 with a result that is not one) or "buried" (the cause not in a one-line message).
def _marker_verdict(o: Outcome, marker: str) -> str:
    """``good`` when the command failed with a first error line matching ``marker`` and no traceback; else silent/buried."""
    if o.rc == 0:
        return "silent"
    errors = [ln for ln in o.stderr.splitlines() if re.search(r"error", ln, flags=re.IGNORECASE)]
    one_line = bool(errors) and re.search(marker, errors[0]) is not None and len(errors) <= 2
    return "good" if one_line and "Traceback" not in o.stderr else "buried"


def _judged(o: Outcome, marker: str, note: str = "") -> dict[str, Any]:
    return {**_fmt(o, note), "verdict": _marker_verdict(o, marker)}


def case_yaml_error_second_config(a: Audit) -> dict[str, Any]:
    (a.work / "second.yaml").write_text("trainer:\n  max_epochs: 1\nmodel: {init_args: {lr: 0.1}\n")
    o = a.cli("fit", "--config", str(_cfg(a.work, "base")), "--config", str(a.work / "second.yaml"))
    return _judged(o, r"second\.yaml:\d+:\d+: invalid YAML")


def case_yaml_error_inline_value(a: Audit) -> dict[str, Any]:
    o = a.cli("fit", "--config", str(_cfg(a.work, "base")), "--trainer", "{max_epochs: 1")
    return _judged(o, r"--trainer:\d+:\d+: invalid YAML")


def case_yaml_error_inline_margins(a: Audit) -> dict[str, Any]:
    o = a.cli("fit", "--config", str(_cfg(a.work, "base")), "--model.init_args.learnable_map", "[[fixed, 0.5], [fixed, 0.7]")
    return _judged(o, r"learnable_map:\d+:\d+: invalid YAML")


def case_yaml_error_margins_file(a: Audit) -> dict[str, Any]:
    (a.work / "margins.yaml").write_text("learnable_map:\n- [fixed, 0.5\n- [fixed, 0.5]\n")
    o = a.cli("fit", "--config", str(_cfg(a.work, "base")), "--model.init_args.learnable_map", str(a.work / "margins.yaml"))
    return _judged(o, r"margins\.yaml:\d+:\d+: invalid YAML")


def case_compile_backbone_bad_mode(a: Audit) -> dict[str, Any]:
    o = a.cli("fit", "--config", str(_cfg(a.work, "base")), "--model.init_args.compile_backbone", "{mode: fastest}")
    return _judged(o, r"compile_backbone\.mode must be .*got 'fastest'")


def case_configs_copy_read_only(a: Audit) -> dict[str, Any]:
    folder = a.work / "readonly"
    folder.mkdir()
    folder.chmod(0o555)
    target = folder if not os.access(folder, os.W_OK) else Path("/sys/kernel")  # root writes anywhere but there
    try:
        o = a.cli("configs", "copy", "cloc/demo", str(target))
    finally:
        folder.chmod(0o755)
    return _judged(o, r"cannot write .*give a folder you can write to", f"into {target}")


def case_configs_copy_two_demos(a: Audit) -> dict[str, Any]:
    first = a.cli("configs", "copy", "cloc/demo")
    second = a.cli("configs", "copy", "corn/demo")
    files = sorted(p.name for p in a.work.glob("*.yaml"))
    texts = {p.read_text() for p in a.work.glob("*.yaml")}
    shipped = {(REPO / "configs" / g / "demo.yaml").read_text() for g in ("cloc", "corn")}
    if first.rc == 0 and second.rc == 0:
        verdict = "good" if len(files) == 2 and texts == shipped else "silent"  # both kept, or one lost
    else:  # a refusal is fine only when its one line says that another shipped config holds the name
        verdict = _marker_verdict(second if first.rc == 0 else first, r"already exists.*(cloc/demo|another|different) (shipped )?config")
    return {**_fmt(second, f"files {files}"), "verdict": verdict}


_THREAD_PROBE = """
import os, sys, torch
from lightning.pytorch.callbacks import Callback
class ThreadProbe(Callback):
    def on_train_start(self, trainer, pl_module):
        cpus = len(os.sched_getaffinity(0))
        print(f"THREADS {torch.get_num_threads()} WORKERS {trainer.datamodule.num_workers} CPUS {cpus}", file=sys.stderr)
"""


def case_threads_beside_workers(a: Audit) -> dict[str, Any]:
    (a.work / "probe_threads.py").write_text(_THREAD_PROBE)
    env = {k: v for k, v in a.env.items() if k != "OMP_NUM_THREADS"}  # the defaults, as a user without the variable
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cloc_lightning",
            "fit",
            "--config",
            str(_cfg(a.work, "threads")),
            "--data.init_args.num_workers",
            str(max(1, cores - 1)),
            "--trainer.max_epochs",
            "1",
            "--trainer.callbacks+=probe_threads.ThreadProbe",
        ],
        cwd=a.work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    m = re.search(r"THREADS (\d+) WORKERS (\d+) CPUS (\d+)", proc.stderr)
    if proc.returncode != 0 or m is None:
        return {
            "rc": proc.returncode,
            "stderr lines": len(proc.stderr.splitlines()),
            "says": "",
            "outcome": f"did not run: {proc.stderr.strip().splitlines()[-1:]}",
            "verdict": "buried",
        }
    threads, workers, cpus = (int(g) for g in m.groups())
    verdict = "good" if threads == 1 or threads + workers <= cpus else "silent"  # oversubscribed: slow, said nowhere
    return {
        "rc": proc.returncode,
        "stderr lines": len(proc.stderr.splitlines()),
        "says": "",
        "outcome": f"{threads} intra-op threads + {workers} loader workers on {cpus} cores",
        "verdict": verdict,
    }


_MISMATCHED_TORCHVISION = """
import importlib.abc, importlib.metadata as md, sys
class Mismatched(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "torchvision":  # what torchvision raises beside a torch of another build
            raise RuntimeError("operator torchvision::nms does not exist")
        return None
sys.meta_path.insert(0, Mismatched())
real = md.version
md.version = lambda name: {"torch": "2.5.1+cpu", "torchvision": "0.20.1"}.get(name) or real(name)
from cloc_lightning.__main__ import main
main(["fit", "--help"])
"""


def case_torchvision_other_build(a: Audit) -> dict[str, Any]:
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", _MISMATCHED_TORCHVISION], cwd=a.work, env=a.env, capture_output=True, text=True, timeout=300
    )
    err = proc.stderr.strip().splitlines()
    hits = [ln for ln in err if re.search(r"error|Error", ln)]
    o = Outcome(
        proc.returncode,
        len(err),
        (hits[0] if hits else (err[-1] if err else ""))[:160],
        time.perf_counter() - start,
        proc.stdout,
        proc.stderr,
    )
    return _judged(o, r"torchvision 0\.20\.1 .*does not fit torch 2\.5\.1\+cpu.*pip install", "simulated import failure")


ROUND2_CASES: dict[str, Callable[[Audit], dict[str, Any]]] = {
    "YAML syntax error in the second --config": case_yaml_error_second_config,
    "YAML syntax error in an inline --trainer value": case_yaml_error_inline_value,
    "YAML syntax error in an inline learnable_map": case_yaml_error_inline_margins,
    "YAML syntax error in a margins file": case_yaml_error_margins_file,
    "--model.compile_backbone '{mode: fastest}'": case_compile_backbone_bad_mode,
    "configs copy into a read-only folder": case_configs_copy_read_only,
    "configs copy cloc/demo, then corn/demo, one folder": case_configs_copy_two_demos,
    "threads beside loader workers (no OMP_NUM_THREADS)": case_threads_beside_workers,
    "torchvision of another build than torch": case_torchvision_other_build,
}
# --------------------------------------------------------------------------------------------- end of round 2 (items 6-11)


CASES: dict[str, Callable[[Audit], dict[str, Any]]] = {
    "predict without weights": case_predict_without_weights,
    "CSV: one label 2.5 among 12 integer classes": case_csv_non_integer_label,
    "CSV: string labels, ordinal, no class_names": case_string_labels_ordinal,
    "folders 0-3, 4-7, 8-14, 15-24 (ordinal)": case_folder_natural_order,
    "diverged run (--model.lr 1e8)": case_diverged_run,
    "failed resume (--ckpt_path last, data of 5 classes)": case_failed_resume_keeps_config,
    "second run pinned to version 0": case_second_run_same_version,
    "--optimizer SGD --optimizer.lr 0.5": case_optimizer_option,
    "--trainer.max_epochs 0": case_max_epochs_0,
    "--trainer.limit_train_batches 0": case_limit_train_batches_0,
    "freeze_at_epoch 5, max_epochs 1": case_freeze_beyond_max_epochs,
    "CSV row naming a missing image": case_csv_missing_image,
    "UTKFace ages outside the bins": case_utkface_ages_clipped,
    "16-bit PNG": case_16bit_png,
    "--data.image_size 0 (CSV images)": case_image_size_0,
    "--model.init_from <margins YAML>": case_init_from_yaml,
    "--data.num_workers -1": _one_line_case("fit", "--config", "{cfg}", "--data.init_args.num_workers", "-1"),
    "missing --ckpt_path file": _one_line_case("fit", "--config", "{cfg}", "--ckpt_path", "{work}/nope.ckpt"),
    "save_dir is a file": case_save_dir_not_a_folder,
    "typo key --model.learning_rate": _one_line_case("fit", "--config", "{cfg}", "--model.init_args.learning_rate", "0.1"),
    "missing --config file": _one_line_case("fit", "--config", "{work}/nope.yaml"),
    "YAML syntax error": case_yaml_syntax_error,
    "--model.num_classes eight": _one_line_case("fit", "--config", "{cfg}", "--model.init_args.num_classes", "eight"),
    "validate: checkpoint of 8 classes, config 5": case_validate_other_class_count,
    "fit --help wall time": case_help_time,
    "probe --help": case_probe_help,
    "--model.help CLOCModule": case_model_help_rest,
    # issue 42 (round 2), items 3, 4, 5, 13
    "phase-two config without its margins file": case_phase2_without_margins,
    "UTKFace ages 0 and 250, label_mode bins": case_utkface_ages_0_and_250_bins,
    "one-class image folder": case_one_class_folder,
    "one-class image folder, --model.num_classes 2": case_one_class_folder_num_classes_2,
    "test on a folder of one's own without data.root": case_test_on_own_folder_without_root,
    "test folder: 26 copies of training faces": case_test_folder_copies_of_training_faces,
    "predict on a UTKFace-named folder": case_predict_utkface_folder_targets,
    "test table and closing line (CSVLogger)": case_test_table_and_closing_line,
    # issue 42 (round 2), items 6, 7, 8, 10, 11
    **ROUND2_CASES,
}


# --------------------------------------------------------------------------------------------- issue 42, items 1, 2, 9, 14
# (one block: the cases, their verdicts and their CASES entries).  verdict: "good" = refused or warned with one line
# naming the fix; "silent" = exit 0 with a result that is not one (or records lost / left behind); "buried" = the cause
# is not in one line, or lost in a traceback.
def _one_line_verdict(o: Outcome, *needles: str) -> str:
    """``good`` when one stderr line holds every needle and there is no traceback, ``silent`` on exit 0, else ``buried``."""
    if o.rc == 0:
        return "silent"
    lines = o.stderr.splitlines()
    if "Traceback" not in o.stderr and any(all(n in ln for n in needles) for ln in lines):
        return "good"
    return "buried"


def _files(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}


def _with_verdict(o: Outcome, note: str, verdict: str) -> dict[str, Any]:
    return {**_fmt(o, f"{note} [verdict: {verdict}]"), "verdict": verdict}


_CE = {"class_path": "cloc_lightning.methods.CEModule", "init_args": {"num_classes": 4, **TINY}}


def _with_model(path: Path, model: dict[str, Any], name: str) -> Path:
    """The config ``path`` with another ``model:`` (and logger name), written next to it as ``<name>.yaml``."""
    cfg = yaml.safe_load(path.read_text())
    cfg["model"] = model
    cfg["trainer"]["logger"]["init_args"]["name"] = name
    out = path.parent / f"{name}.yaml"
    out.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return out


def case_predict_corn_init_from_ce(a: Audit) -> dict[str, Any]:
    ce = _with_model(_cfg(a.work, "base", trainer={"max_epochs": 1}), _CE, "ce_src")
    out = a.cli("fit", "--config", str(ce))
    assert out.rc == 0, out.stderr[-2000:]
    ckpt = sorted((a.work / "runs" / "ce_src").glob("version_*/checkpoints/last.ckpt"))[-1]
    corn = _with_model(
        ce,
        {"class_path": "cloc_lightning.methods.OrdinalRegressionModule", "init_args": {"num_classes": 4, "head": "corn", **TINY}},
        "corn",
    )
    for i in range(4):
        _jpeg(a.work / "pred" / f"p{i}.jpg", i)
    o = a.cli(
        "predict", "--config", str(corn), "--model.init_args.init_from", str(ckpt), "--data.init_args.predict_root", str(a.work / "pred")
    )
    wrote = list((a.work / "runs" / "corn").glob("version_*/predictions.csv"))
    verdict = "silent" if wrote else _one_line_verdict(o, "predict with --model.init_from", "head.*", "--ckpt_path")
    return _with_verdict(o, "predictions.csv from an untrained CORN head" if wrote else "no predictions written", verdict)


def case_test_cloc_init_from_supcon(a: Audit) -> dict[str, Any]:
    views = {
        "class_path": "cloc_lightning.data.OrdinalShapesDataModule",
        "init_args": {
            "num_classes": 4,
            "train_size": 32,
            "val_size": 8,
            "test_size": 8,
            "batch_size": 8,
            "num_workers": 0,
            "image_size": 32,
            "train_views": {"class_path": "cloc_lightning.data.SupConViews", "init_args": {"n_views": 2}},
        },
    }
    supcon = {"class_path": "cloc_lightning.methods.SupConModule", "init_args": {**TINY}}
    cfg = _with_model(_cfg(a.work, "base", data=views, trainer={"max_epochs": 1}), supcon, "supcon_src")
    out = a.cli("fit", "--config", str(cfg))
    assert out.rc == 0, out.stderr[-2000:]
    ckpt = sorted((a.work / "runs" / "supcon_src").glob("version_*/checkpoints/last.ckpt"))[-1]
    o = a.cli("test", "--config", str(_cfg(a.work, "cloc_test")), "--model.init_args.init_from", str(ckpt))
    scored = "test/mae" in o.stdout or "test/qwk" in o.stdout
    verdict = "silent" if scored else _one_line_verdict(o, "test with --model.init_from", "head.*", "--ckpt_path")
    return _with_verdict(o, "test metrics of an untrained head" if scored else "not scored", verdict)


def case_resume_finished_run(a: Audit) -> dict[str, Any]:
    a.trained("finished", extra=("--test_after_fit", "true"))
    run = _run_dir(a.work, "finished")
    before = _files(a.work / "runs" / "finished")
    o = a.cli("fit", "--config", str(_cfg(a.work, "finished")), "--ckpt_path", "last", "--test_after_fit", "true")
    changed = sorted(k for k, v in _files(a.work / "runs" / "finished").items() if before.get(k) != v)
    tested = "test/" in o.stdout
    note = f"{'tested again; ' if tested else ''}records {'changed: ' + ', '.join(changed[:4]) if changed else 'untouched'}"
    verdict = "silent" if changed or tested else _one_line_verdict(o, "end of its run", "epoch 2 of max_epochs 2", "--trainer.max_epochs 3")
    return _with_verdict(o, f"{run.name}: {note}", verdict)


def case_extend_finished_run_lr(a: Audit) -> dict[str, Any]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = _cfg(a.work, "extend", trainer={"max_epochs": 1})
    a.trained("extend", trainer={"max_epochs": 1})
    o = a.cli("fit", "--config", str(cfg), "--ckpt_path", "last", "--trainer.max_epochs", "2")
    lrs: dict[int, float] = {}
    for f in sorted(_run_dir(a.work, "extend").glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(f))
        acc.Reload()
        tags = [t for t in acc.Tags()["scalars"] if t.startswith("lr-")]
        if tags:
            lrs.update({e.step: e.value for e in acc.Scalars(sorted(tags)[0])})
    steps = sorted(lrs)
    first_new = lrs.get(2)  # 2 steps per epoch: step 2 is the first step of the extension
    note = f"LR per step {[round(lrs[k], 6) for k in steps]}"
    if o.rc != 0 or first_new is None:
        return _with_verdict(o, note + " (no resumed step logged)", "buried")
    return _with_verdict(o, note, "silent" if first_new == 0.0 else "good")


def case_refused_and_failed_runs_leave_no_folder(a: Audit) -> dict[str, Any]:
    for i in range(4):
        _jpeg(a.work / "pred" / f"p{i}.jpg", i)
    cfg = str(_cfg(a.work, "left"))
    labels = [str(i % 4) for i in range(24)]
    missing = str(_cfg(a.work, "left_csv", data=_csv_data(a.work, labels, missing=1)))
    runs = [
        a.cli("predict", "--config", cfg, "--data.init_args.predict_root", str(a.work / "pred")),
        a.cli("fit", "--config", cfg, "--trainer.max_epochs", "0"),
        a.cli("fit", "--config", missing, "--trainer.logger.init_args.name", "left"),
    ]
    folders = sorted((a.work / "runs" / "left").glob("version_*"))
    empty = [f.name for f in folders if not list(f.glob("checkpoints/*.ckpt")) and not list(f.glob("predictions*.csv"))]
    worst = "good"
    for o in runs:
        v = _one_line_verdict(o, "error")
        worst = v if v != "good" else worst
    verdict = "silent" if empty else worst
    note = f"3 refused/failed commands; run folders left without a result: {empty or 'none'}"
    return _with_verdict(runs[-1], note, verdict)


CASES.update(
    {
        "predict: CORN config, --model.init_from <CE last.ckpt>": case_predict_corn_init_from_ce,
        "test: CLOC config, --model.init_from <SupCon last.ckpt>": case_test_cloc_init_from_supcon,
        "--ckpt_path last on a finished run": case_resume_finished_run,
        "finished run extended with --trainer.max_epochs 2 (LR)": case_extend_finished_run_lr,
        "refused and failed runs leave no version_N folder": case_refused_and_failed_runs_leave_no_folder,
    }
)


# --------------------------------------------------------------------------------------------- a second site as class folders
# ImageFolderDataModule(test_root=...) (2026-11-29): a site may lack classes (indices by folder name); a folder that is no
# class is refused; without data.root the site's own folders are the classes unless data.class_order is given.
_FOLDER_RUN: dict[str, Path] = {}


def _folder_trained(a: Audit) -> dict[str, Path]:
    if not _FOLDER_RUN or not _FOLDER_RUN["ckpt"].is_file():
        root = a.work / "abc"
        for split, n in (("train", 8), ("test", 2)):
            for k, c in enumerate("abc"):
                for i in range(n):
                    _jpeg(root / split / c / f"{split}{i}.jpg", 100 * k + i + (50 if split == "test" else 0))
        data = {
            "class_path": "cloc_lightning.data.ImageFolderDataModule",
            "init_args": {"root": str(root), "batch_size": 4, "num_workers": 0, "image_size": 24},
        }
        _FOLDER_RUN.update(root=root, ckpt=a.trained("abc", model={"num_classes": 3}, data=data))
    return _FOLDER_RUN


def _site(a: Audit, name: str, classes: dict[str, int]) -> Path:
    for k, (c, n) in enumerate(classes.items()):
        for i in range(n):
            _jpeg(a.work / name / c / f"s{i}.jpg", 900 + 10 * k + i)
    return a.work / name


def _folder_test(a: Audit, name: str, **data_args: Any) -> Outcome:
    data = {
        "class_path": "cloc_lightning.data.ImageFolderDataModule",
        "init_args": {"batch_size": 4, "num_workers": 0, "image_size": 24, **data_args},
    }
    csv_logger = {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(a.work / "runs"), "name": name}}
    cfg = _cfg(a.work, name, model={"num_classes": 3}, data=data, trainer={"logger": csv_logger, "limit_test_batches": 1.0})
    return a.cli("test", "--config", str(cfg), "--ckpt_path", str(_folder_trained(a)["ckpt"]))


def case_folder_site_lacking_a_class(a: Audit) -> dict[str, Any]:
    run = _folder_trained(a)
    o = _folder_test(a, "site_ac", root=str(run["root"]), test_root=str(_site(a, "site_ac", {"a": 3, "c": 2})))
    scored = _table(o.stdout).get("test/images")
    good = o.rc == 0 and scored is not None and float(scored) == 5
    return {**_fmt(o, f"scored {scored} images" if o.rc == 0 else "refused"), "verdict": _verdict(o, good)}


def case_folder_site_with_an_unknown_class(a: Audit) -> dict[str, Any]:
    run = _folder_trained(a)
    o = _folder_test(a, "site_ad", root=str(run["root"]), test_root=str(_site(a, "site_ad", {"a": 2, "d": 2})))
    good = _refused_in_one_line(o, "not training classes", "'d'")
    return {**_fmt(o, "refused naming the folder" if good else "scored or unclear"), "verdict": _verdict(o, good)}


def case_folder_site_alone_lacking_a_class(a: Audit) -> dict[str, Any]:
    o = _folder_test(a, "site_alone", test_root=str(_site(a, "site_alone", {"a": 3, "c": 2})))
    good = _refused_in_one_line(o, "data.class_order")
    return {
        **_fmt(o, "refused naming data.class_order" if good else "scored under shifted labels or unclear"),
        "verdict": _verdict(o, good),
    }


CASES.update(
    {
        "test: class folders, second site lacking a class": case_folder_site_lacking_a_class,
        "test: class folders, second site with a folder that is no class": case_folder_site_with_an_unknown_class,
        "test: class folders, second site alone (no root, no class_order) lacking a class": case_folder_site_alone_lacking_a_class,
    }
)


# --------------------------------------------------------------------------------------------- a second site as a CSV
# CSVDataModule(test_csv=...) (2026-11-29): the same rules for a table: a site may lack classes (indices by the training
# CSV's labels); a label that is no class is refused naming its line; without data.csv_path the site's own labels are the
# classes unless data.class_names is given.
_CSV_RUN: dict[str, Path] = {}
_CSV_CLASSES = ["young", "adult", "old"]


def _csv_file(folder: Path, rows: list[tuple[str, str]], seed: int) -> Path:
    lines = ["path,label"]
    for k, (label, image) in enumerate(rows):
        _jpeg(folder / "img" / image, seed + k)
        lines.append(f"img/{image},{label}")
    (folder / "labels.csv").write_text("\n".join(lines) + "\n")
    return folder / "labels.csv"


def _csv_trained(a: Audit) -> dict[str, Path]:
    if not _CSV_RUN or not _CSV_RUN["ckpt"].is_file():
        csv = _csv_file(a.work / "table", [(c, f"{c}{i}.jpg") for c in _CSV_CLASSES for i in range(10)], 300)
        data = {
            "class_path": "cloc_lightning.data.CSVDataModule",
            "init_args": {"csv_path": str(csv), "class_names": _CSV_CLASSES, "batch_size": 4, "num_workers": 0, "image_size": 24},
        }
        _CSV_RUN.update(csv=csv, ckpt=a.trained("table", model={"num_classes": 3}, data=data))
    return _CSV_RUN


def _csv_test(a: Audit, name: str, rows: list[tuple[str, str]], **data_args: Any) -> Outcome:
    site = _csv_file(a.work / name, rows, 950)
    data = {
        "class_path": "cloc_lightning.data.CSVDataModule",
        "init_args": {"test_csv": str(site), "batch_size": 4, "num_workers": 0, "image_size": 24, **data_args},
    }
    csv_logger = {"class_path": "lightning.pytorch.loggers.CSVLogger", "init_args": {"save_dir": str(a.work / "runs"), "name": name}}
    cfg = _cfg(a.work, name, model={"num_classes": 3}, data=data, trainer={"logger": csv_logger, "limit_test_batches": 1.0})
    return a.cli("test", "--config", str(cfg), "--ckpt_path", str(_csv_trained(a)["ckpt"]))


def case_csv_site_lacking_a_class(a: Audit) -> dict[str, Any]:
    run = _csv_trained(a)
    rows = [("old", "a.jpg"), ("young", "b.jpg"), ("old", "c.jpg")]
    o = _csv_test(a, "csv_site_yo", rows, csv_path=str(run["csv"]), class_names=_CSV_CLASSES)
    scored = _table(o.stdout).get("test/images")
    good = o.rc == 0 and scored is not None and float(scored) == 3
    return {**_fmt(o, f"scored {scored} images" if o.rc == 0 else "refused"), "verdict": _verdict(o, good)}


def case_csv_site_with_a_label_that_is_no_class(a: Audit) -> dict[str, Any]:
    run = _csv_trained(a)
    o = _csv_test(a, "csv_site_mid", [("old", "a.jpg"), ("middle", "b.jpg")], csv_path=str(run["csv"]), class_names=_CSV_CLASSES)
    good = _refused_in_one_line(o, "no training class", "line 3")
    return {**_fmt(o, "refused naming the row" if good else "scored or unclear"), "verdict": _verdict(o, good)}


def case_csv_site_alone_lacking_a_class(a: Audit) -> dict[str, Any]:
    o = _csv_test(a, "csv_site_alone", [("old", "a.jpg"), ("young", "b.jpg")], task="nominal")
    good = _refused_in_one_line(o, "data.class_names")
    return {
        **_fmt(o, "refused naming data.class_names" if good else "scored under shifted labels or unclear"),
        "verdict": _verdict(o, good),
    }


CASES.update(
    {
        "test: CSV, second site lacking a class": case_csv_site_lacking_a_class,
        "test: CSV, second site with a label that is no class": case_csv_site_with_a_label_that_is_no_class,
        "test: CSV, second site alone (no csv_path, no class_names) lacking a class": case_csv_site_alone_lacking_a_class,
    }
)


# ---- round 5's outside user (2026-12-07): data optimize, probe, command and Trainer names
_SHAPES = ("--data", "OrdinalShapesDataModule", "--data.num_classes", "4", "--data.train_size", "16", "--data.val_size", "8",
           "--data.test_size", "8")  # fmt: skip


def _one_line_case(o: Outcome, what: str, *needles: str, nothing_in: Path | None = None) -> dict[str, Any]:
    good = _refused_in_one_line(o, *needles) and (nothing_in is None or not any(nothing_in.iterdir()))
    return {**_fmt(o, f"refused naming {what}" if good else "ran, wrote, or unclear"), "verdict": _verdict(o, good)}


def case_optimize_empty_out(a: Audit) -> dict[str, Any]:
    o = a.cli("data", "optimize", *_SHAPES, "--out", "")
    return _one_line_case(o, "--out", "--out is empty", nothing_in=a.work)


def case_optimize_out_under_a_file(a: Audit) -> dict[str, Any]:
    (a.work / "afile").write_text("")
    o = a.cli("data", "optimize", *_SHAPES, "--out", str(a.work / "afile" / "sub"))
    return _one_line_case(o, "the file in the way", "afile is a file, not a folder")


def case_optimize_zero_workers(a: Audit) -> dict[str, Any]:
    return _one_line_case(a.cli("data", "optimize", *_SHAPES, "--out", "c", "--workers", "0"), "--workers", "--workers 0")


def case_optimize_damaged_record(a: Audit) -> dict[str, Any]:
    a.cli("data", "optimize", *_SHAPES, "--out", "c", "--format", "raw")
    (a.work / "c" / "cloc_stream.json").write_text("{bad")
    return _one_line_case(a.cli("data", "optimize", *_SHAPES, "--out", "c"), "--overwrite", "damaged", "--overwrite true")


def case_probe_run_config(a: Audit) -> dict[str, Any]:
    cfg = _cfg(a.work, "run", model={"num_classes": 4}, data={"class_path": "OrdinalShapesDataModule", "init_args": {"num_classes": 4}})
    o = a.cli("probe", "--config", str(cfg), "--ckpt", "nope.ckpt")
    return _one_line_case(o, "the checkpoint, not the trainer section", "nope.ckpt", "does not exist")


def case_probe_no_gpu(a: Audit) -> dict[str, Any]:
    o = a.cli("probe", "--ckpt", "nope.ckpt", *_SHAPES, "--device", "gpu")
    return _one_line_case(o, "--device", "--device 'gpu' is not a torch device")


def case_trainer_strategy_typo(a: Audit) -> dict[str, Any]:
    o = a.cli("fit", "--config", str(a.repo / "configs" / "cloc" / "demo.yaml"), "--trainer.strategy", "dpp")
    return _one_line_case(o, "the nearest strategy", "--trainer.strategy dpp", "did you mean ddp")


def case_unknown_command(a: Audit) -> dict[str, Any]:
    return _one_line_case(a.cli("prob", "--ckpt", "x"), "the nearest command", "unknown command 'prob'", "did you mean probe")


CASES.update(
    {
        "data optimize: --out empty (wrote into the current folder)": case_optimize_empty_out,
        "data optimize: --out under a file": case_optimize_out_under_a_file,
        "data optimize: --workers 0": case_optimize_zero_workers,
        "data optimize: a damaged cloc_stream.json": case_optimize_damaged_record,
        "probe: a run's own config": case_probe_run_config,
        "probe: --device gpu": case_probe_no_gpu,
        "fit: --trainer.strategy dpp": case_trainer_strategy_typo,
        "a command typo: prob": case_unknown_command,
    }
)


def _generated(audit_repo: Path, tmp: Path, only: list[str], jobs: int) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """The generated cases (:mod:`benchmarks.option_sweep`: every ``fit`` option × wrong type, near miss, empty, wrong kind
    of file), each through the command in a subprocess of its own folder; ``(name, kind, row)``."""
    from concurrent.futures import ThreadPoolExecutor

    from benchmarks.option_sweep import Result, generate, judge, write_fixtures

    fixtures = tmp / "sweep-fixtures"
    cases = [c for c in generate(fixtures) if not only or any(s in f"generated: {c.id}".lower() for s in only)]
    if not cases:
        return
    write_fixtures(fixtures)

    def one(i_case: tuple[int, Any]) -> tuple[str, str, dict[str, Any]]:
        i, case = i_case
        work = tmp / f"sweep-{i}"
        work.mkdir()
        o = Audit(audit_repo, work).cli(*case.argv, timeout=300)
        verdict = judge(case, Result(o.rc, o.stderr, o.stdout))
        return f"generated: {case.id}", case.kind, _fmt(o, f"{case.kind} of {case.option}", verdict)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        yield from pool.map(one, enumerate(cases))  # in order, each as soon as it and those before it are done


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repo", type=Path, default=REPO, help="the checkout whose cloc_lightning is run (default: this one)")
    p.add_argument("--only", default="", help="comma-separated substrings of case names")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="generated cases run at once (default: the cores)")
    p.add_argument("--no-generated", action="store_true", help="only the cases listed here, not the generated sweep")
    args = p.parse_args(argv)
    only = [s.strip().lower() for s in args.only.split(",") if s.strip()]
    print(f"| case | exit code | stderr lines | first error line | outcome | verdict |  (repo: {args.repo})")
    print("|---|---|---|---|---|---|")
    verdicts: dict[str, int] = {}
    by_kind: dict[str, dict[str, int]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, kind, r in [] if args.no_generated else _generated(args.repo.resolve(), Path(tmp), only, args.jobs):
            verdicts[r["verdict"]] = verdicts.get(r["verdict"], 0) + 1
            by_kind.setdefault(kind, {}).setdefault(r["verdict"], 0)
            by_kind[kind][r["verdict"]] += 1
            print(f"| {name} | {r['rc']} | {r['stderr lines']} | {r['says']} | {r['outcome']} | {r['verdict']} |", flush=True)
        for name, fn in CASES.items():
            if only and not any(s in name.lower() for s in only):
                continue
            work = Path(tmp) / re.sub(r"\W+", "_", name)[:40]
            work.mkdir()
            try:
                r = fn(Audit(args.repo.resolve(), work))
            except Exception as e:  # noqa: BLE001 - a case that cannot run is reported, the rest go on
                r = {
                    "rc": "-",
                    "stderr lines": "-",
                    "says": "",
                    "verdict": "audit failed",
                    "outcome": f"audit failed: {type(e).__name__}: {e}"[:200],
                }
            verdicts[r["verdict"]] = verdicts.get(r["verdict"], 0) + 1
            print(f"| {name} | {r['rc']} | {r['stderr lines']} | {r['says']} | {r['outcome']} | {r['verdict']} |", flush=True)
    for kind, counts in sorted(by_kind.items()):
        print(f"\ngenerated, {kind}: " + ", ".join(f"{n} {v}" for v, n in sorted(counts.items())), end="")
    print("\n" + ", ".join(f"{n} {v}" for v, n in sorted(verdicts.items())) + f" (of {sum(verdicts.values())} cases)")
    if any(v != "good" for v in verdicts):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
