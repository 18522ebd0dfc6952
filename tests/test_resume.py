"""Reliability through the CLI: wrong types and typos in configs, a fit SIGKILLed and resumed with ``--ckpt_path last``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from tests._reliability import (
    _cli_config,
    _fit_killed_at,
    _last_ckpt,
    _tiny_cli_config,
    assert_same,
)
from tests.conftest import run_cli


def test_learnable_map_wrong_type_from_yaml_through_the_cli(tmp_path: Path) -> None:
    """YAML strings: jsonargparse reads a quoted number ('0.4') as the number; anything else is refused by name."""
    cfg = _tiny_cli_config({"learnable_map": [["fixed", "0.4"], ["fixed", "abc"], ["fixed", 0.6]]})
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(cfg))
    proc = run_cli(["fit", "--config", "bad.yaml"], tmp_path, check=False, timeout=180)
    assert proc.returncode != 0
    assert "learnable_map[1]: the margin value must be a number > 0 or None, got 'abc'" in proc.stderr
    assert "learnable_map[0]" not in proc.stderr  # '0.4' became 0.4


def test_config_typos_fail_naming_the_key(tmp_path: Path) -> None:
    """An unknown key in YAML, or on the command line, stops while parsing with the key named.

    (Command-line options may be abbreviated to a unique prefix, argparse's ``allow_abbrev``:
    ``--trainer.max_epoch`` *is* ``--trainer.max_epochs``; a key that is no prefix is refused.)
    """
    cfg = _tiny_cli_config({"margn_lr": 0.1})
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    proc = run_cli(["fit", "--config", "cfg.yaml"], tmp_path, check=False, timeout=180)
    assert proc.returncode != 0 and "margn_lr" in proc.stderr, proc.stderr[-2000:]
    (tmp_path / "good.yaml").write_text(yaml.safe_dump(_tiny_cli_config({"margin_lr": 0.1})))
    proc = run_cli(["fit", "--config", "good.yaml", "--trainer.max_epochz", "1"], tmp_path, check=False, timeout=180)
    assert proc.returncode != 0 and "max_epochz" in proc.stderr, proc.stderr[-2000:]
    assert "Epoch" not in proc.stdout + proc.stderr  # stopped while parsing, before any training


@pytest.mark.slow
def test_cli_fit_killed_and_resumed_equals_an_uninterrupted_run(tmp_path: Path) -> None:
    """SIGKILL at the epoch 0/1 boundary (the margin freeze then happens in the resumed run) and mid-epoch 1
    (margins frozen, one optimiser group); each time resume with ``--ckpt_path last``.  The final checkpoint
    equals the uninterrupted run's bit for bit: weights, margins, Adam state, LR schedule, loop progress,
    CLOC phase state.  (Mid-epoch with learnable margins: ``test_resume_in_process_...``.)"""
    run_cli(["fit", "--config", str(_cli_config(tmp_path, "reference"))], tmp_path, timeout=300)
    reference = torch.load(_last_ckpt(tmp_path / "runs" / "reference"), map_location="cpu", weights_only=False)
    assert reference["global_step"] == 12 and reference["cloc"]["margins_frozen"]

    # first run: nothing to resume yet; killed at the epoch 0/1 boundary (last.ckpt: end of epoch 0, before the freeze)
    out = _fit_killed_at(tmp_path, "chain", 4, resume=True)
    assert "--ckpt_path last: no last checkpoint found for this run; training starts from scratch" in out
    out = _fit_killed_at(tmp_path, "chain", 6, resume=True)  # freezes on resume; killed mid-epoch 1
    assert "--ckpt_path last: resuming from" in out and "version_0" in out
    final = run_cli(["fit", "--config", str(_cli_config(tmp_path, "chain")), "--ckpt_path", "last"], tmp_path, timeout=300)
    assert "--ckpt_path last: resuming from" in final.stdout and "logging into its run folder version_0" in final.stdout
    assert len(list((tmp_path / "runs" / "chain").glob("version_*"))) == 1  # every restart logged into the first run's folder

    resumed = torch.load(_last_ckpt(tmp_path / "runs" / "chain"), map_location="cpu", weights_only=False)
    assert_same(resumed["state_dict"], reference["state_dict"], "state_dict")
    assert_same(resumed["optimizer_states"], reference["optimizer_states"], "optimizer_states")
    assert_same(resumed["lr_schedulers"], reference["lr_schedulers"], "lr_schedulers")
    assert_same(resumed["cloc"], reference["cloc"], "cloc")
    assert_same(resumed["callbacks"]["CLOCMarginFreeze"], reference["callbacks"]["CLOCMarginFreeze"], "freeze")
    assert_same(resumed["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"],
                reference["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"], "batch_progress")
    assert (resumed["global_step"], resumed["epoch"]) == (reference["global_step"], reference["epoch"])
    assert len(resumed["optimizer_states"][0]["param_groups"]) == 1  # the margins group left at the freeze


@pytest.mark.slow
def test_cli_relic_fit_killed_mid_epoch_and_resumed_equals_an_uninterrupted_run(tmp_path: Path) -> None:
    """ReLIC: online + EMA target (cosine beta), gamma schedule, learnable tau/b, cosine LR, multi-crop views.
    SIGKILL at step 5 (mid-epoch 1), resume with ``--ckpt_path last``: the final checkpoint equals the
    uninterrupted run's (target encoder/projector included) bit for bit."""
    run_cli(["fit", "--config", str(_cli_config(tmp_path, "reference", setup="relic"))], tmp_path, timeout=300)
    reference = torch.load(_last_ckpt(tmp_path / "runs" / "reference"), map_location="cpu", weights_only=False)
    assert reference["global_step"] == 8
    _fit_killed_at(tmp_path, "chain", 5, resume=True, setup="relic")
    final = run_cli(["fit", "--config", str(_cli_config(tmp_path, "chain", setup="relic")), "--ckpt_path", "last"],
                    tmp_path, timeout=300)
    assert "--ckpt_path last: resuming from" in final.stdout
    resumed = torch.load(_last_ckpt(tmp_path / "runs" / "chain"), map_location="cpu", weights_only=False)
    assert any(k.startswith("target_encoder.") for k in resumed["state_dict"])
    assert_same(resumed["state_dict"], reference["state_dict"], "state_dict")  # online, target, tau, b, probe
    assert_same(resumed["optimizer_states"], reference["optimizer_states"], "optimizer_states")
    assert_same(resumed["lr_schedulers"], reference["lr_schedulers"], "lr_schedulers")
    assert (resumed["global_step"], resumed["epoch"]) == (reference["global_step"], reference["epoch"])
