"""The newcomer's audit: bad inputs and traps through the real command line, measured.

Each case runs ``python -m cloc_lightning ...`` in a subprocess on tiny generated data (the
built-in shapes data, a folder of JPEGs, a CSV, UTKFace-named files) and records the exit
code, the number of lines the command printed on stderr, the first line that says what went
wrong and the outcome that matters for the case (was a "best" checkpoint or a margins YAML
written, did ``config.yaml`` change, how were ordinal classes ranked).  Run it on two
checkouts to get a before/after table::

    python -m benchmarks.bad_inputs                       # this checkout; prints a markdown table
    python -m benchmarks.bad_inputs --repo /tmp/old-tree  # another checkout (its cloc_lightning first on PYTHONPATH)
    python -m benchmarks.bad_inputs --only predict,typo   # cases whose name contains one of these

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
from collections.abc import Callable
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


def _cfg(work: Path, name: str, model: dict[str, Any] | None = None, data: dict[str, Any] | None = None,
         trainer: dict[str, Any] | None = None, freeze_at: int | None = None) -> Path:
    cfg: dict[str, Any] = {
        "seed_everything": 0,
        "trainer": {"accelerator": "cpu", "devices": 1, "max_epochs": 2, "enable_progress_bar": False,
                    "enable_model_summary": False, "limit_train_batches": 2, "limit_val_batches": 1,
                    "limit_test_batches": 1, "num_sanity_val_steps": 0, "log_every_n_steps": 1,
                    "logger": {"class_path": "lightning.pytorch.loggers.TensorBoardLogger",
                               "init_args": {"save_dir": str(work / "runs"), "name": name}},
                    **(trainer or {})},
        "model": {"class_path": "cloc_lightning.methods.CLOCModule",
                  "init_args": {"num_classes": 4, **TINY, **(model or {})}},
        "data": data or {"class_path": "cloc_lightning.data.OrdinalShapesDataModule", "init_args": {
            "num_classes": 4, "train_size": 32, "val_size": 8, "test_size": 8, "batch_size": 8, "num_workers": 0,
            "image_size": 32}},
    }
    if freeze_at is not None:
        cfg["trainer"]["callbacks"] = [{"class_path": "cloc_lightning.callbacks.CLOCMarginFreeze",
                                        "init_args": {"freeze_at_epoch": freeze_at}}]
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def _csv_data(work: Path, labels: list[str], missing: int = 0, task: str = "ordinal",
              class_names: list[str] | None = None) -> dict[str, Any]:
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
    args: dict[str, Any] = {"csv_path": str(path), "split_column": "split", "task": task, "batch_size": 4,
                            "num_workers": 0, "image_size": 24}
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
        proc = subprocess.run([sys.executable, "-m", "cloc_lightning", *args], cwd=self.work, env=self.env,
                              capture_output=True, text=True, timeout=timeout)
        seconds = time.perf_counter() - start
        err = proc.stderr.strip().splitlines()
        hits = [ln for ln in err if re.search(r"error|Error|refus|SIGTERM", ln)]
        return Outcome(proc.returncode, len(err), (hits[0] if hits else (err[-1] if err else ""))[:160], seconds,
                       proc.stdout, proc.stderr)

    def trained(self, name: str, extra: tuple[str, ...] = (), **kw: Any) -> Path:
        """A finished 2-epoch fit; returns its last.ckpt."""
        out = self.cli("fit", "--config", str(_cfg(self.work, name, **kw)), *extra)
        assert out.rc == 0, out.stderr[-2000:]
        return sorted((self.work / "runs" / name).glob("version_*/checkpoints/last.ckpt"))[-1]


def _fmt(o: Outcome, note: str = "") -> dict[str, Any]:
    return {"rc": o.rc, "stderr lines": o.lines, "says": o.first.replace("|", "/"), "outcome": note}


def _run_dir(work: Path, name: str) -> Path:
    found = sorted((work / "runs" / name).glob("version_*"))
    return found[-1] if found else work / "runs" / name / "version_0"


# --------------------------------------------------------------------------------------------- cases
def case_predict_without_weights(a: Audit) -> dict[str, Any]:
    for i in range(4):
        _jpeg(a.work / "pred" / f"p{i}.jpg", i)
    o = a.cli("predict", "--config", str(_cfg(a.work, "pred")), "--data.init_args.predict_root", str(a.work / "pred"))
    wrote = list((a.work / "runs" / "pred").glob("version_*/predictions.csv"))
    return _fmt(o, "predictions.csv written" if wrote else "no predictions written")


def case_csv_non_integer_label(a: Audit) -> dict[str, Any]:
    labels = [str(i % 12) for i in range(36)] + ["2.5"]
    o = a.cli("fit", "--config", str(_cfg(a.work, "csv25", model={"num_classes": 13}, data=_csv_data(a.work, labels))),
              "--trainer.max_epochs", "1")
    return _fmt(o, "trained" if o.rc == 0 else "stopped")


def case_string_labels_ordinal(a: Audit) -> dict[str, Any]:
    labels = ["young", "adult", "old"] * 6
    o = a.cli("fit", "--config", str(_cfg(a.work, "strlab", model={"num_classes": 3},
                                          data=_csv_data(a.work, labels))), "--trainer.max_epochs", "1")
    return _fmt(o, "trained (alphabetical ranks)" if o.rc == 0 else "stopped")


def case_folder_natural_order(a: Audit) -> dict[str, Any]:
    folders = ["0-3", "4-7", "8-14", "15-24"]
    for split in ("train", "val", "test"):
        for c, name in enumerate(folders):
            for i in range(3):
                _jpeg(a.work / "agefolders" / split / name / f"{i}.jpg", 10 * c + i)
    code = ("from cloc_lightning.data import ImageFolderDataModule as D; "
            f"d=D(root={str(a.work / 'agefolders')!r}, task='ordinal', batch_size=2, num_workers=0, image_size=24); "
            "d.setup('fit'); print(list(d.class_names))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=a.work, env=a.env, capture_output=True, text=True, timeout=300)
    order = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr.strip().splitlines()[-1]
    return {"rc": proc.returncode, "stderr lines": len(proc.stderr.strip().splitlines()), "says": "",
            "outcome": f"ranks {order}"}


def case_diverged_run(a: Audit) -> dict[str, Any]:
    o = a.cli("fit", "--config", str(_cfg(a.work, "diverged", model={"lr": 1e8}, freeze_at=1)),
              "--test_after_fit", "true")
    run = _run_dir(a.work, "diverged")
    best = list(run.glob("checkpoints/best*.ckpt"))
    margins = run / "cloc_margins.yaml"
    note = f"best ckpt {'written' if best else 'none'}; margins YAML {'written' if margins.exists() else 'none'}"
    return _fmt(o, note)


def case_failed_resume_keeps_config(a: Audit) -> dict[str, Any]:
    a.trained("records")
    run = _run_dir(a.work, "records")
    before = (run / "config.yaml").read_text()
    # the model's class count does not match the data: since the CLI links num_classes from the data module this
    # is refused before any record is written (tests/cli/test_cli_records.py fails a resume later, after them)
    o = a.cli("fit", "--config", str(_cfg(a.work, "records")), "--ckpt_path", "last",
              "--data.init_args.num_classes", "5")
    after = (run / "config.yaml").read_text()
    extra = sorted(p.name for p in run.glob("config*.yaml"))
    return _fmt(o, f"config.yaml {'unchanged' if before == after else 'OVERWRITTEN'}; {extra}")


def case_second_run_same_version(a: Audit) -> dict[str, Any]:
    a.trained("pinned", extra=("--trainer.logger.init_args.version", "0"))
    run = a.work / "runs" / "pinned" / "version_0"
    before = (run / "config.yaml").read_text()
    o = a.cli("fit", "--config", str(_cfg(a.work, "pinned")), "--trainer.logger.init_args.version", "0",
              "--model.init_args.lr", "0.01")
    after = (run / "config.yaml").read_text()
    return _fmt(o, f"first run's config.yaml {'unchanged' if before == after else 'OVERWRITTEN'}")


def case_optimizer_option(a: Audit) -> dict[str, Any]:
    o = a.cli("fit", "--config", str(_cfg(a.work, "optim")), "--optimizer", "SGD", "--optimizer.lr", "0.5",
              "--trainer.max_epochs", "1")
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
    return _fmt(o, f"{'said so' if warned else 'silent'} (phase two never reached)")


def case_csv_missing_image(a: Audit) -> dict[str, Any]:
    labels = [str(i % 4) for i in range(24)]
    o = a.cli("fit", "--config", str(_cfg(a.work, "csvmiss", data=_csv_data(a.work, labels, missing=1))),
              "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "1")
    return _fmt(o, "trained (missing file not reached)" if o.rc == 0 else "stopped")


def case_utkface_ages_clipped(a: Audit) -> dict[str, Any]:
    for i, age in enumerate([3, 10, 25, 40, 60, 95, 100, 110] * 3):
        _jpeg(a.work / "utk" / f"{age}_0_0_2017{i:08d}.jpg", i)
    # raw ages 1..80 as 80 classes (label_mode: age): 95, 100 and 110 are clipped into the class '80'
    data = {"class_path": "cloc_lightning.data.UTKFaceDataModule", "init_args": {
        "root": str(a.work / "utk"), "label_mode": "age", "batch_size": 4, "num_workers": 0, "image_size": 24}}
    o = a.cli("fit", "--config", str(_cfg(a.work, "utk", model={"num_classes": 80}, data=data)),
              "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "1")
    counted = any("clip" in ln and re.search(r"\d+ above", ln) for ln in (o.stderr + o.stdout).splitlines())
    return _fmt(o, "clipped ages counted" if counted else "clipped silently")


def case_16bit_png(a: Audit) -> dict[str, Any]:
    import numpy as np
    from PIL import Image

    path = a.work / "png16" / "x.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    values = (np.arange(64 * 64).reshape(64, 64) * 16).astype(np.uint16)  # a 16-bit ramp over the full range
    Image.fromarray(values).save(path)
    true = float((np.round(values / 257.0) >= 250).mean())
    code = ("try:\n    from cloc_lightning.data.datasets import ImageFileDataset as D\n"
            "except ImportError:  # a checkout from before data/base.py was split\n"
            "    from cloc_lightning.data.base import ImageFileDataset as D\n"
            "import torch; import numpy as np; "
            f"x=np.asarray(D([{str(path)!r}], [0]).load(0)); print(float((x >= 250).mean()))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=a.work, env=a.env, capture_output=True, text=True, timeout=300)
    share = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr.strip()[-200:]
    return {"rc": proc.returncode, "stderr lines": 0, "says": "", "outcome": f"share of pixels >= 250: {share} (the ramp's true share: {true:.3f})"}


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
    return _fmt(a.cli("fit", "--config", str(_cfg(a.work, "size0", data=_csv_data(a.work, labels))),
                      "--data.init_args.image_size", "0"))


def case_save_dir_not_a_folder(a: Audit) -> dict[str, Any]:
    (a.work / "afile").write_text("x")
    return _fmt(a.cli("fit", "--config", str(_cfg(a.work, "base")), "--trainer.logger.init_args.save_dir",
                      str(a.work / "afile")))


def case_yaml_syntax_error(a: Audit) -> dict[str, Any]:
    (a.work / "broken.yaml").write_text("model:\n  class_path: cloc_lightning.methods.CLOCModule\n  init_args: {num_classes: 4\n")
    return _fmt(a.cli("fit", "--config", str(a.work / "broken.yaml")))


def case_validate_other_class_count(a: Audit) -> dict[str, Any]:
    ckpt = a.trained("eight", model={"num_classes": 8}, data={
        "class_path": "cloc_lightning.data.OrdinalShapesDataModule", "init_args": {
            "num_classes": 8, "train_size": 32, "val_size": 8, "test_size": 8, "batch_size": 8, "num_workers": 0,
            "image_size": 32}})
    cfg = _cfg(a.work, "five", model={"num_classes": 5}, data={
        "class_path": "cloc_lightning.data.OrdinalShapesDataModule", "init_args": {
            "num_classes": 5, "train_size": 32, "val_size": 8, "test_size": 8, "batch_size": 8, "num_workers": 0,
            "image_size": 32}})
    return _fmt(a.cli("validate", "--config", str(cfg), "--ckpt_path", str(ckpt)))


def case_help_time(a: Audit) -> dict[str, Any]:
    times = []
    for _ in range(3):
        o = a.cli("fit", "--help")
        times.append(o.seconds)
    return {"rc": o.rc, "stderr lines": o.lines, "says": "",
            "outcome": f"{min(times):.1f} s (min of 3; median {sorted(times)[1]:.1f} s)"}


def case_probe_help(a: Audit) -> dict[str, Any]:
    o = a.cli("probe", "--help")
    return {"rc": o.rc, "stderr lines": o.lines, "says": "",
            "outcome": "shows '<function … <lambda>>'" if "<lambda>" in o.stdout else "no lambda reprs"}


def case_model_help_rest(a: Audit) -> dict[str, Any]:
    o = a.cli("fit", "--model.help", "CLOCModule")
    raw = len(re.findall(r":(class|func|meth|attr):|``", o.stdout))
    return {"rc": o.rc, "stderr lines": o.lines, "says": "", "outcome": f"{raw} raw reST markups"}


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
    corn = _with_model(ce, {"class_path": "cloc_lightning.methods.OrdinalRegressionModule",
                            "init_args": {"num_classes": 4, "head": "corn", **TINY}}, "corn")
    for i in range(4):
        _jpeg(a.work / "pred" / f"p{i}.jpg", i)
    o = a.cli("predict", "--config", str(corn), "--model.init_args.init_from", str(ckpt),
              "--data.init_args.predict_root", str(a.work / "pred"))
    wrote = list((a.work / "runs" / "corn").glob("version_*/predictions.csv"))
    verdict = "silent" if wrote else _one_line_verdict(o, "predict with --model.init_from", "head.*", "--ckpt_path")
    return _with_verdict(o, "predictions.csv from an untrained CORN head" if wrote else "no predictions written", verdict)


def case_test_cloc_init_from_supcon(a: Audit) -> dict[str, Any]:
    views = {"class_path": "cloc_lightning.data.OrdinalShapesDataModule", "init_args": {
        "num_classes": 4, "train_size": 32, "val_size": 8, "test_size": 8, "batch_size": 8, "num_workers": 0,
        "image_size": 32, "train_views": {"class_path": "cloc_lightning.data.SupConViews", "init_args": {"n_views": 2}}}}
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
    verdict = ("silent" if changed or tested else
               _one_line_verdict(o, "end of its run", "epoch 2 of max_epochs 2", "--trainer.max_epochs 3"))
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


CASES.update({
    "predict: CORN config, --model.init_from <CE last.ckpt>": case_predict_corn_init_from_ce,
    "test: CLOC config, --model.init_from <SupCon last.ckpt>": case_test_cloc_init_from_supcon,
    "--ckpt_path last on a finished run": case_resume_finished_run,
    "finished run extended with --trainer.max_epochs 2 (LR)": case_extend_finished_run_lr,
    "refused and failed runs leave no version_N folder": case_refused_and_failed_runs_leave_no_folder,
})


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repo", type=Path, default=REPO, help="the checkout whose cloc_lightning is run (default: this one)")
    p.add_argument("--only", default="", help="comma-separated substrings of case names")
    args = p.parse_args(argv)
    only = [s.strip().lower() for s in args.only.split(",") if s.strip()]
    print(f"| case | exit code | stderr lines | first error line | outcome |  (repo: {args.repo})")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, fn in CASES.items():
            if only and not any(s in name.lower() for s in only):
                continue
            work = Path(tmp) / re.sub(r"\W+", "_", name)[:40]
            work.mkdir()
            try:
                r = fn(Audit(args.repo.resolve(), work))
            except Exception as e:  # noqa: BLE001 - a case that cannot run is reported, the rest go on
                r = {"rc": "-", "stderr lines": "-", "says": "", "outcome": f"audit failed: {type(e).__name__}: {e}"[:200]}
            print(f"| {name} | {r['rc']} | {r['stderr lines']} | {r['says']} | {r['outcome']} |", flush=True)


if __name__ == "__main__":
    main()
