"""A method's arguments: what a module records and what the command line sees stay as they were.

The hyper-parameters (``model.hparams``: what checkpoints keep and ``load_from_checkpoint``
rebuilds from) of every method class built in Python, with its defaults and with a few
overrides, and the ``model`` section that ``--print_config`` gives for every shipped config
(what LightningCLI hands the module as its hyper-parameters), compared with the values the
code before the explicit signatures (``methods/defaults.py``) gave, stored in
``tests/fixtures/method_hparams.json``.  Regenerate only on purpose (a deliberate change of a
default or a key), and say so in the commit::

    python -m tests.methods.test_method_arguments --write
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from typing import Any

import pytest

from tests._config_chain import PROBE_CONFIGS
from tests.conftest import REPO, TINY_BACKBONE

FIXTURE = REPO / "tests" / "fixtures" / "method_hparams.json"
#: a tiny CLIP (tests/methods/test_ordinal_clip_module.py's)
_TINY_CLIP = {
    "embed_dim": 24,
    "vision_cfg": {"layers": 1, "width": 32, "head_width": 16, "patch_size": 8, "image_size": 16},
    "text_cfg": {"context_length": 24, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
}
_ENCODER = {"backbone": TINY_BACKBONE, "cifar_stem": False, "backbone_kwargs": None}
_CLIP = {"clip_model": "ViT-S-32-alt", "clip_config": _TINY_CLIP, "num_context_tokens": 4}
_PRE = {"backbone": TINY_BACKBONE, "online_probe": False}

#: ``name: (class name in cloc_lightning.methods, constructor arguments)``: each method with its defaults and with overrides
#: of a shared option (optimiser, schedule, online probe, EMA) and of one of its own
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "CEModule": ("CEModule", {"num_classes": 4, "backbone": TINY_BACKBONE}),
    "CEModule+": ("CEModule", {"num_classes": 4, "backbone": TINY_BACKBONE, "lr": 0.2, "label_smoothing": 0.1}),
    "CLOCModule": ("CLOCModule", {"num_classes": 4, "backbone": TINY_BACKBONE}),
    "CLOCModule+": ("CLOCModule", {"num_classes": 4, "backbone": TINY_BACKBONE, "optimizer": "sgd", "margin_lr": 0.05}),
    "OrdinalRegressionModule": ("OrdinalRegressionModule", {"num_classes": 4, "backbone": TINY_BACKBONE}),
    "OrdinalRegressionModule+": (
        "OrdinalRegressionModule",
        {"num_classes": 4, "backbone": TINY_BACKBONE, "head": "coral", "weight_decay": 0.01},
    ),
    "PretrainModule": ("PretrainModule", {"backbone": TINY_BACKBONE}),
    "PretrainModule+": (
        "PretrainModule",
        {"backbone": TINY_BACKBONE, "num_classes": 3, "task": "nominal", "knn_k": 5, "online_probe_lr": 0.3, "lr": 0.01},
    ),
    "SupConModule": ("SupConModule", dict(_PRE)),
    "SupConModule+": ("SupConModule", {**_PRE, "method": "simclr", "lr": 0.1, "warmup_epochs": 0.0, "knn_k": 3, "projector_dim": 16}),
    "RnCModule": ("RnCModule", dict(_PRE)),
    "RnCModule+": ("RnCModule", {**_PRE, "temperature": 1.0, "optimizer": "adam", "min_lr_ratio": 0.0}),
    "ReLICModule": ("ReLICModule", dict(_PRE)),
    "ReLICModule+": (
        "ReLICModule",
        {**_PRE, "beta": 0.9, "update_beta_after_step": 0, "knn_k": 0, "lr": 1e-3, "alpha": 0.5, "scheduler": "cosine"},
    ),
    "LinearProbeModule": ("LinearProbeModule", {"num_classes": 4, "encoder_info": _ENCODER}),
    "LinearProbeModule+": (
        "LinearProbeModule",
        {"num_classes": 4, "encoder_info": _ENCODER, "lr": 1.0, "normalize_features": True, "pretrained": False},
    ),
    "LinearRegressorModule": ("LinearRegressorModule", {"num_classes": 4, "encoder_info": _ENCODER}),
    "LinearRegressorModule+": (
        "LinearRegressorModule",
        {"num_classes": 4, "encoder_info": _ENCODER, "lr": 0.5, "min_lr_ratio": 0.0, "task": "ordinal"},
    ),
    "OrdinalCLIPModule": ("OrdinalCLIPModule", {"num_classes": 5, **_CLIP}),
    "OrdinalCLIPModule+": (
        "OrdinalCLIPModule",
        {"num_classes": 5, **_CLIP, "lr": 1e-3, "optimizer": "adam", "num_base_ranks": 2, "rank_lr": 0.01},
    ),
}


def _plain(value: Any) -> Any:
    """A value as JSON keeps it (tuples as lists); NaN/inf are no recorded values here."""
    return json.loads(json.dumps(value))


def built_hparams(case: str) -> dict[str, Any]:
    """``dict(model.hparams)`` of the module of ``CASES[case]``."""
    import torch

    import cloc_lightning.methods as methods

    name, kwargs = CASES[case]
    torch.manual_seed(0)
    return _plain(dict(getattr(methods, name)(**json.loads(json.dumps(kwargs))).hparams))


def shipped_configs() -> list[str]:
    """Every shipped ``fit`` config (the offline-probe configs have no model)."""
    configs = (p.relative_to(REPO / "configs").as_posix() for p in (REPO / "configs").rglob("*.yaml"))
    return sorted(f"configs/{c}" for c in configs if c not in PROBE_CONFIGS)


def printed_model_config(config: str) -> dict[str, Any]:
    """The ``model`` section (``class_path`` and every ``init_args`` key) of ``fit --config <config> --print_config``."""
    import yaml

    from cloc_lightning.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_:
        main(["fit", "--config", str(REPO / config), "--print_config"])
    assert exit_.value.code in (0, None), (config, out.getvalue()[-2000:])
    return _plain(yaml.safe_load(out.getvalue())["model"])


def _differences(got: dict[str, Any], want: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    keys = set(got) | set(want)
    missing = object()
    return {k: (got.get(k, missing), want.get(k, missing)) for k in sorted(keys) if k not in got or k not in want or got[k] != want[k]}


def _stored() -> dict[str, Any]:
    return dict(json.loads(FIXTURE.read_text()))


@pytest.mark.parametrize("case", list(CASES))
def test_hparams_of_a_module_built_in_python_are_as_before(case: str) -> None:
    want = _stored()["built"][case]
    got = built_hparams(case)
    assert not _differences(got, want), f"{case}: (now, before) {_differences(got, want)}"


@pytest.mark.parametrize("config", shipped_configs())
def test_model_config_of_every_shipped_config_is_as_before(config: str) -> None:
    want = _stored()["configs"][config]
    got = printed_model_config(config)
    assert got["class_path"] == want["class_path"]
    assert not _differences(got["init_args"], want["init_args"]), (
        f"{config}: (now, before) {_differences(got['init_args'], want['init_args'])}"
    )


def test_every_shipped_config_has_a_stored_record() -> None:
    assert sorted(_stored()["configs"]) == shipped_configs()


def _write() -> None:
    record = {
        "built": {case: built_hparams(case) for case in CASES},
        "configs": {config: printed_model_config(config) for config in shipped_configs()},
    }
    FIXTURE.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"wrote {FIXTURE}: {len(record['built'])} modules, {len(record['configs'])} configs")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        raise SystemExit("usage: python -m tests.methods.test_method_arguments --write")
    del sys.argv[1:]  # LightningCLI reads sys.argv beside the arguments it is given
    _write()
