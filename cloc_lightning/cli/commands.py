"""The ``cloc-lightning`` sub-commands that are not LightningCLI's: ``probe``, ``export-prototypes``, ``configs``, ``cache``, ``data``.

Each command is a function ``command(argv) -> result`` that parses its own arguments; the
``cloc-lightning`` entry point (:func:`cloc_lightning.cli.main`) dispatches ``argv[0]`` through
:data:`COMMANDS` and lists them in its ``--help``.  The work itself is done by library code
(:func:`cloc_lightning.probe.probe_checkpoint`,
:meth:`~cloc_lightning.methods.ordinal_clip.OrdinalCLIPModule.export_prototypes`,
:mod:`cloc_lightning.configs`); this module is the
layer under the CLI: it imports methods and the probe library, and nothing in the package imports
it except the CLI (its help formatter lives in :mod:`cloc_lightning.cli.helptext`).  How to use them: ``docs/cli.md``.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
from collections.abc import Callable
from typing import Any

import torch
from jsonargparse import ActionConfigFile, ArgumentError, ArgumentParser
from torch import nn

import cloc_lightning.data  # noqa: F401  (registers the data modules for --data)
from cloc_lightning.checkpoints import read_checkpoint
from cloc_lightning.cli.helptext import CLOCHelpFormatter
from cloc_lightning.configs import configs_main
from cloc_lightning.data.base import BaseDataModule
from cloc_lightning.data.optimize import ImageFormat, optimize_data
from cloc_lightning.data.stores import cache_main
from cloc_lightning.methods.ordinal_clip import OrdinalCLIPModule
from cloc_lightning.nn.prototype_classifier import PrototypeClassifier
from cloc_lightning.probe import ProbePreset, ProbeSplit, probe_checkpoint
from cloc_lightning.validation import write_problem

__all__ = ["COMMANDS", "probe_main", "export_prototypes_main", "data_main", "parse_command_args"]


def parse_command_args(parser: ArgumentParser, argv: list[str] | None) -> Any:
    """``parser.parse_args(argv)`` for a command's jsonargparse parser (built with ``exit_on_error=False``).

    A parse error is raised, not printed with jsonargparse's usage: it carries the parser as ``cloc_parser`` and
    :func:`cloc_lightning.cli.main` prints it as one line naming the key and the fix, as for ``fit``.
    """
    try:
        return parser.parse_args(argv)
    except ArgumentError as e:
        e.cloc_parser = parser  # type: ignore[attr-defined]
        raise


# ---------------------------------------------------------------- probe
def probe_main(argv: list[str] | None = None) -> dict[str, Any]:
    """Linear probe (scikit-learn) of a checkpoint's frozen encoder on a data module.

    ``cloc-lightning probe --ckpt CKPT --data <DataModule> [--data.<arg> ...] [--preset ...]``, or
    ``--config probe.yaml`` with the same keys; prints top-1/top-5 and returns the result of
    :func:`~cloc_lightning.probe.probe_checkpoint` (also written as JSON with ``--output``).
    ``--preset`` (:data:`~cloc_lightning.probe.PROBE_PRESETS`) sets ``C``, ``max_iter``,
    ``normalize``, ``standardize`` and ``calibrated``; any of them given explicitly overrides it.
    """
    parser = ArgumentParser(
        prog="cloc-lightning probe",
        formatter_class=CLOCHelpFormatter,
        description="Fit scikit-learn LogisticRegression on frozen encoder features of a checkpoint; print top-1/top-5.",
        env_prefix="CLOC_PROBE",
        default_env=False,
        exit_on_error=False,
        allow_abbrev=False,
    )
    parser.add_argument("--config", action=ActionConfigFile)
    parser.add_argument("--ckpt", type=str, required=True, help="stage-one checkpoint (.ckpt) or encoder state_dict file")
    parser.add_subclass_arguments(BaseDataModule, "data", required=True, help="the data module (train: probe fit, test: score)")
    parser.add_argument(
        "--preset",
        type=ProbePreset,
        default="default",
        help="probe protocol: 'default' (C 1, max_iter 1000, standardised, unnormalised features) or 'sigmoid_cl' "
        "(the ReLIC-sigmoid seed: CalibratedClassifierCV(LogisticRegression(max_iter=100)) on L2-normalised, "
        "unstandardised features); the options below override it",
    )
    parser.add_argument("--C", type=float | None, default=None, help="inverse L2 regularisation of LogisticRegression (preset: 1.0)")
    parser.add_argument("--max_iter", type=int | None, default=None, help="L-BFGS iterations (preset: 1000 / sigmoid_cl 100)")
    parser.add_argument(
        "--normalize", type=bool | None, default=None, help="L2-normalise features before the probe (preset: false / sigmoid_cl true)"
    )
    parser.add_argument(
        "--standardize",
        type=bool | None,
        default=None,
        help="standardise features, training-set statistics (preset: true / sigmoid_cl false)",
    )
    parser.add_argument(
        "--calibrated",
        type=bool | None,
        default=None,
        help="wrap the classifier in CalibratedClassifierCV (preset: false / sigmoid_cl true)",
    )
    parser.add_argument("--backbone", type=str | None, default=None, help="override the checkpoint's timm backbone name")
    parser.add_argument("--cifar_stem", type=bool | None, default=None, help="override the checkpoint's cifar_stem")
    parser.add_argument("--split", type=ProbeSplit, default="test", help="the split scored: test or val")
    parser.add_argument("--device", type=str, default="cpu", help="where the encoder runs: cpu, cuda, cuda:1, mps")
    parser.add_argument("--output", type=str | None, default=None, help="also write the result as JSON here")
    own = {a.dest.split(".", 1)[0] for a in parser._actions if a.dest}
    for key in sorted(_fit_config_keys(list(argv or []), own)):  # a fit config's sections the probe does not use (model, ...)
        parser.add_argument(f"--{key}", type=Any, default=None, help=argparse.SUPPRESS)
    cfg = parse_command_args(parser, argv)
    _check_device(cfg.device)
    if cfg.output:
        _check_output_file(cfg.output)
    init = parser.instantiate_classes(cfg)
    result = probe_checkpoint(
        cfg.ckpt,
        init.data,
        device=cfg.device,
        C=cfg.C,
        max_iter=cfg.max_iter,
        normalize=cfg.normalize,
        standardize=cfg.standardize,
        backbone=cfg.backbone,
        cifar_stem=cfg.cifar_stem,
        split=cfg.split,
        calibrated=cfg.calibrated,
        preset=cfg.preset,
    )
    settings = ", ".join(f"{k}={v}" for k, v in result["settings"].items())
    lines = [
        f"probe ({result['split']}) of {result['encoder']}, backbone {result['backbone']}:",
        f"  preset {result['preset']}: {settings}",
    ]
    for k in ("top1", "top5", "train_top1"):
        if k in result and math.isfinite(result[k]):
            lines.append(f"  {k}: {100 * result[k]:.2f}%")
    lines.append(f"  n_train={int(result['n_train'])} n_test={int(result['n_test'])} n_features={int(result['n_features'])}")
    print("\n".join(lines))
    if cfg.output:
        with open(cfg.output, "w") as f:
            json.dump(result, f, indent=2)
    return result


def _check_device(device: str) -> None:
    """``--device``: a torch device this machine has, else one line before anything is loaded."""
    try:
        kind = torch.device(device).type
    except (RuntimeError, ValueError):
        kind = None  # raised below, outside the handler: the CLI shows the innermost error of the package's own
    if kind is None:
        raise ValueError(f"--device {device!r} is not a torch device; give cpu, cuda, cuda:1 or mps")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: this machine has no CUDA GPU (torch.cuda.is_available() is False); give --device cpu")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"--device {device}: this machine has no MPS device; give --device cpu")


def _check_output_file(path: str) -> None:
    """``--output``: a file that can be written (its folder is created), checked before the probe runs."""
    why = "it is a folder" if os.path.isdir(path) else write_problem(os.path.dirname(os.path.abspath(path)))
    if why is not None:
        why = why if "not a folder" in why else why.lower()
        raise ValueError(f"--output {path}: cannot write there ({why}); give a file path in a folder you may write")


# ---------------------------------------------------------------- export-prototypes
def _count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def export_prototypes_main(argv: list[str] | None = None) -> PrototypeClassifier:
    """OrdinalCLIP checkpoint -> prototype classifier file (export-prototypes CKPT OUT).

    Loads the :class:`~cloc_lightning.methods.ordinal_clip.OrdinalCLIPModule` checkpoint on CPU
    (when the checkpoint holds the text encoder weights, CLIP is re-created with
    ``pretrained=None`` and filled from the checkpoint: no download), computes the R prototypes
    once and writes image encoder + prototypes
    (:class:`~cloc_lightning.nn.prototype_classifier.PrototypeClassifier`).
    """
    parser = argparse.ArgumentParser(
        prog="cloc-lightning export-prototypes",
        description="Export an OrdinalCLIP checkpoint as image encoder + R language prototypes "
        "(PrototypeClassifier): no text encoder needed at inference, the cost of a linear head.",
    )
    parser.add_argument("ckpt", help="OrdinalCLIPModule checkpoint (.ckpt) written by `cloc-lightning fit`")
    parser.add_argument("out", help="output file (.pt), loaded with PrototypeClassifier.load(out)")
    parser.add_argument(
        "--rank-offset", type=float, default=0.0, help="value of rank 0 for predict(): rank_values = offset + arange(R) (e.g. min_age)"
    )
    parser.add_argument("--rank-step", type=float, default=1.0, help="spacing of the rank values (default 1)")
    args = parser.parse_args(argv)
    try:  # memory-mapped: only the hyper-parameters and key names are read here
        ckpt = read_checkpoint(
            args.ckpt, mmap=True, what="checkpoint", hint="give an OrdinalCLIPModule checkpoint (.ckpt) written by `cloc-lightning fit`"
        )
    except (FileNotFoundError, ValueError) as e:
        parser.error(str(e))
    hp = ckpt.get("hyper_parameters", {})
    state = ckpt.get("state_dict", {})
    if "clip_model" not in hp or not any(k.startswith("head.") for k in state):
        parser.error(f"{args.ckpt!r} is not an OrdinalCLIPModule checkpoint (no clip_model hyper-parameter or head)")
    overrides: dict[str, Any] = {"init_from": None}
    if any(".text_encoder." in k for k in state) or hp.get("head") == "linear":
        overrides["pretrained"] = None  # every weight is in the checkpoint: do not fetch pretrained CLIP
    model = OrdinalCLIPModule.load_from_checkpoint(args.ckpt, map_location="cpu", **overrides).eval()
    R = model.num_classes
    values = args.rank_offset + args.rank_step * torch.arange(R, dtype=torch.float32)
    clf = model.export_prototypes(args.out, rank_values=values)
    n_enc, n_module = _count(clf.image_encoder), _count(model)
    D = clf.prototypes.shape[1]
    print(
        f"exported {R} prototypes (D={D}) + image encoder to {args.out} "
        f"({os.path.getsize(args.out) / 2**20:.1f} MiB)\n"
        f"  parameters: image encoder {n_enc:,} + prototypes {R * D:,} (a linear head would have {R * D + R:,}); "
        f"training module incl. frozen text encoder {n_module:,}\n"
        f"  load: PrototypeClassifier.load({args.out!r}); predict(images) -> rank values "
        f"{float(values[0]):g}..{float(values[-1]):g}"
    )
    return clf


# ---------------------------------------------------------------- data optimize
def _fit_config_keys(argv: list[str], own: set[str]) -> set[str]:
    """The top-level keys of the ``--config`` files in ``argv`` other than the command's ``own``, and LightningCLI's.

    A command that reads a fit config (``data optimize``, ``probe``) takes its own keys and ignores the others.
    """
    import yaml

    keys = {"model", "trainer", "optimizer", "lr_scheduler", "ckpt_path", "seed_everything"}
    paths = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--config"] + [
        a.split("=", 1)[1] for a in argv if a.startswith("--config=")
    ]
    for path in paths:
        try:
            with open(path) as f:
                data = yaml.safe_load(f)
        except (OSError, yaml.YAMLError):
            continue  # the parser reports it
        if isinstance(data, dict):
            for key in map(str, data):
                near = difflib.get_close_matches(key, sorted(own), n=1, cutoff=0.75)
                if key not in own and key not in keys and near:  # a typo of a setting would be ignored silently
                    raise ValueError(f"--config {path}: {key!r} is not a setting here; did you mean {near[0]!r}?")
                keys.add(key)
    return keys - own - {"config"}


def data_main(argv: list[str] | None = None) -> dict[str, Any]:
    """Write a config's data as LitData chunks for data.stream_from: ``data optimize --config CFG --out DIR_OR_URL``.

    The data module is built from the config's ``data`` section (``--data.<arg>`` overrides it; the
    ``model``/``trainer`` sections are read and ignored) and :func:`~cloc_lightning.data.optimize.optimize_data`
    writes its splits; returns the ``cloc_stream.json`` record.
    """
    argv = list(argv or [])
    if argv[:1] != ["optimize"]:
        problem = f"unknown action {argv[0]!r}; " if argv and not argv[0].startswith("-") else ""
        if argv[:1] in (["-h"], ["--help"]):
            print("usage: cloc-lightning data optimize --config CFG --out DIR_OR_URL [options]  (data optimize --help: the options)")
            return {}
        raise ValueError(f"cloc-lightning data: {problem}give `data optimize --config CFG --out DIR_OR_URL`")
    parser = ArgumentParser(
        prog="cloc-lightning data optimize",
        formatter_class=CLOCHelpFormatter,
        description="Write every split of a config's data module as LitData chunks (local folder or s3:// URL) for data.stream_from.",
        default_env=False,
        exit_on_error=False,
        allow_abbrev=False,
    )
    parser.add_argument("--config", action=ActionConfigFile)
    parser.add_subclass_arguments(BaseDataModule, "data", required=True, help="the data module whose splits are written")
    parser.add_argument("--out", type=str, required=True, help="a folder (created) or an object-storage URL (s3://bucket/prefix)")
    parser.add_argument("--format", type=ImageFormat, default="jpeg", help="jpeg, webp, png (lossless) or raw (data.cache's pixels)")
    parser.add_argument("--quality", type=int, default=95, help="JPEG / WebP quality, 1-100")
    parser.add_argument(
        "--workers",
        type=int | None,
        default=None,
        help="writer processes (default: 1 for splits under 10,000 images, else the CPUs, at most 8)",
    )
    parser.add_argument("--chunk_bytes", type=str, default="64MB", help="bytes per chunk, e.g. 64MB")
    parser.add_argument("--splits", type=list[str], default=["train", "val", "test"], help="the splits to write")
    parser.add_argument("--overwrite", type=bool, default=False, help="replace chunks built from other data at --out")
    own = {"data", "out", "format", "quality", "workers", "chunk_bytes", "splits", "overwrite"}
    for key in sorted(_fit_config_keys(argv[1:], own)):  # a fit config's other sections (model, trainer, test_after_fit, ...)
        parser.add_argument(f"--{key}", type=Any, default=None, help=argparse.SUPPRESS)
    cfg = parse_command_args(parser, argv[1:])
    init = parser.instantiate_classes(cfg)
    record = optimize_data(
        init.data,
        cfg.out,
        image_format=cfg.format,
        quality=cfg.quality,
        workers=cfg.workers,
        chunk_bytes=cfg.chunk_bytes,
        splits=cfg.splits,
        overwrite=cfg.overwrite,
    )
    splits = ", ".join(f"{name} {info.get('n')}" for name, info in record["splits"].items())
    size = sum(int(info.get("bytes") or 0) for info in record["splits"].values())
    print(f"data optimize: {cfg.out}: {splits} images, {size / 1e6:.1f} MB written or kept; train with --data.stream_from {cfg.out}")
    return record


#: the sub-commands of ``cloc-lightning`` beside LightningCLI's (name -> ``command(argv)``); the
#: first line of each docstring is its ``--help`` summary.  Register your own here.
COMMANDS: dict[str, Callable[[list[str] | None], Any]] = {
    "probe": probe_main,
    "export-prototypes": export_prototypes_main,
    "configs": configs_main,
    "cache": cache_main,
    "data": data_main,
}
