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


# --------------------------------------------------------------------------------------------- issue 42 round 2: items 6, 7, 8, 10, 11
# Each returns a "verdict" computed from what it observed: "good" (refused or warned with one line naming the
# fix), "silent" (exit 0 with a result that is not one) or "buried" (the cause not in a one-line message).
def _verdict(o: Outcome, marker: str) -> str:
    """``good`` when the command failed with a first error line matching ``marker`` and no traceback; else silent/buried."""
    if o.rc == 0:
        return "silent"
    errors = [ln for ln in o.stderr.splitlines() if re.search(r"error", ln, flags=re.IGNORECASE)]
    one_line = bool(errors) and re.search(marker, errors[0]) is not None and len(errors) <= 2
    return "good" if one_line and "Traceback" not in o.stderr else "buried"


def _judged(o: Outcome, marker: str, note: str = "") -> dict[str, Any]:
    return {**_fmt(o, note), "verdict": _verdict(o, marker)}


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
        verdict = _verdict(second if first.rc == 0 else first, r"already exists.*(cloc/demo|another|different) (shipped )?config")
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
    proc = subprocess.run([sys.executable, "-m", "cloc_lightning", "fit", "--config", str(_cfg(a.work, "threads")),
                           "--data.init_args.num_workers", str(max(1, cores - 1)), "--trainer.max_epochs", "1",
                           "--trainer.callbacks+=probe_threads.ThreadProbe"],
                          cwd=a.work, env=env, capture_output=True, text=True, timeout=600)
    m = re.search(r"THREADS (\d+) WORKERS (\d+) CPUS (\d+)", proc.stderr)
    if proc.returncode != 0 or m is None:
        return {"rc": proc.returncode, "stderr lines": len(proc.stderr.splitlines()), "says": "",
                "outcome": f"did not run: {proc.stderr.strip().splitlines()[-1:]}", "verdict": "buried"}
    threads, workers, cpus = (int(g) for g in m.groups())
    verdict = "good" if threads == 1 or threads + workers <= cpus else "silent"  # oversubscribed: slow, said nowhere
    return {"rc": proc.returncode, "stderr lines": len(proc.stderr.splitlines()), "says": "",
            "outcome": f"{threads} intra-op threads + {workers} loader workers on {cpus} cores", "verdict": verdict}


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
    proc = subprocess.run([sys.executable, "-c", _MISMATCHED_TORCHVISION], cwd=a.work, env=a.env, capture_output=True,
                          text=True, timeout=300)
    err = proc.stderr.strip().splitlines()
    hits = [ln for ln in err if re.search(r"error|Error", ln)]
    o = Outcome(proc.returncode, len(err), (hits[0] if hits else (err[-1] if err else ""))[:160],
                time.perf_counter() - start, proc.stdout, proc.stderr)
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
    **ROUND2_CASES,
}


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
            verdict = f" ({r['verdict']})" if "verdict" in r else ""
            print(f"| {name} | {r['rc']} | {r['stderr lines']} | {r['says']} | {r['outcome']}{verdict} |", flush=True)


if __name__ == "__main__":
    main()
