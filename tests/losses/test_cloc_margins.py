"""The owner of CLOC's margins (issue 30, item 5): parse, validate, freeze, log, YAML in/out.

Margin values are checked against ``log(1 + exp(raw))`` computed with :mod:`math` from the
stored raw values, never against the code's own softplus.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from cloc_lightning.losses.cloc import OrdinalContrastiveLoss_mm, OrdinalContrastiveLoss_sm
from cloc_lightning.losses.cloc_margins import (
    LAYOUT_TITLE,
    CLOCMargins,
    MultiMargins,
    SingleMargin,
    load_learnable_map,
)


def _softplus(raw: float) -> float:
    return math.log1p(math.exp(raw))


def _one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(exc.value)
    assert "\n" not in text, text
    return text


# ----------------------------------------------------------------------------
# parse and validate
# ----------------------------------------------------------------------------
def test_a_map_gives_the_margins_it_names() -> None:
    m = MultiMargins(4, [["fixed", 0.3], ["learnable", 0.6], ["fixed", 0.9]])
    raw = [float(m.fixed_raw[0]), float(m.learnables.detach()[0]), float(m.fixed_raw[2])]
    assert [_softplus(r) for r in raw] == pytest.approx([0.3, 0.6, 0.9], rel=1e-6)
    assert m.margins().tolist() == pytest.approx([0.3, 0.6, 0.9], rel=1e-6)
    assert m.margin_kinds() == ["fixed", "learnable", "fixed"] and m.mode == "mm"
    assert [p.shape for p in m.margin_parameters()] == [torch.Size([1])]
    s = SingleMargin(5, [["fixed", 0.47]])
    assert _softplus(float(s.distance[0])) == pytest.approx(0.47, rel=1e-6)
    assert s.margins().tolist() == pytest.approx([0.47] * 4, rel=1e-6) and s.margin_parameters() == []
    assert not s.learnable and s.margin_kinds() == ["fixed"] and s.mode == "sm"


def test_none_draws_every_margin_from_u_half_one_in_map_order() -> None:
    torch.manual_seed(7)
    a = MultiMargins(6)
    torch.manual_seed(7)
    b = OrdinalContrastiveLoss_mm(6)  # the loss draws the same margins: it is the same owner
    values = [_softplus(float(r)) for r in a.learnables.detach()]
    assert all(0.5 <= v <= 1.0 for v in values) and len(set(values)) == 5
    assert torch.equal(a.learnables, b.learnables)


def test_the_losses_are_their_margins_owner() -> None:
    mm, sm = OrdinalContrastiveLoss_mm(4), OrdinalContrastiveLoss_sm(4)
    assert isinstance(mm, MultiMargins) and isinstance(sm, SingleMargin)
    assert isinstance(mm, CLOCMargins) and isinstance(sm, CLOCMargins)
    assert set(mm.state_dict()) == set(MultiMargins(4).state_dict()) == {"learnables", "fixed_raw", "learnable_mask", "learnable_index"}
    assert set(sm.state_dict()) == set(SingleMargin(4).state_dict()) == {"distance"}


BAD_MAPS: list[tuple[Any, type[Exception], str]] = [
    (
        lambda: MultiMargins(4, [["fixed", 0.1]] * 2),
        ValueError,
        r"learnable_map has 2 entries but MultiMargins\(n_classes=4\) needs exactly 3 .*check n_classes or the phase-two",
    ),
    (lambda: SingleMargin(4, [["fixed", 0.1]] * 3), ValueError, r"SingleMargin \(a single margin\) needs exactly 1"),
    (
        lambda: MultiMargins(3, [["frozen", 0.1], ["fixed", 0.2]]),
        ValueError,
        r"learnable_map\[0\]: kind must be 'learnable' or 'fixed', got 'frozen'",
    ),
    (lambda: MultiMargins(3, [["fixed", None], ["fixed", 0.2]]), ValueError, r"needs a value, e\.g\. \['fixed', 0\.4\]"),
    (
        lambda: MultiMargins(3, [["fixed", 0.2], ["fixed", -1.0]]),
        ValueError,
        r"learnable_map\[1\]: the margin value must be a number > 0 or None, got -1\.0; .*finite and > 0",
    ),
    (lambda: MultiMargins(3, [["fixed", "0.4"], ["fixed", 0.2]]), TypeError, r"write the number without quotes"),
    (lambda: MultiMargins(3, "[[fixed, 0.4]]"), TypeError, r"list of \[kind, value\] pairs"),
    (lambda: MultiMargins(1), ValueError, r"n_classes must be >= 2.*CLOC needs at least two"),
    (
        lambda: load_learnable_map("no/such/margins.yaml"),
        FileNotFoundError,
        r"pass the margins YAML written by CLOCMarginFreeze \(<log_dir>/cloc_margins.yaml\) or an inline list",
    ),
    (lambda: load_learnable_map(3), TypeError, r"learnable_map must be a list of \[kind, value\] pairs or a YAML file path"),
]


@pytest.mark.parametrize("make,exc,match", BAD_MAPS)
def test_bad_maps_are_one_line_errors_naming_the_fix(make: Any, exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match) as info:
        make()
    _one_line(info)


def test_load_learnable_map_reads_lists_files_and_inline_yaml(tmp_path: Path) -> None:
    lmap = [["fixed", 0.5], ["learnable", None]]
    assert load_learnable_map(lmap) is lmap and load_learnable_map(None) is None
    assert load_learnable_map("[[fixed, 0.5], [learnable, null]]") == lmap
    (tmp_path / "bare.yaml").write_text(yaml.safe_dump(lmap))
    (tmp_path / "full.yaml").write_text(yaml.safe_dump({"learnable_map": lmap, "n_classes": 3}))
    assert load_learnable_map(str(tmp_path / "bare.yaml")) == load_learnable_map(str(tmp_path / "full.yaml")) == lmap
    (tmp_path / "other.yaml").write_text(yaml.safe_dump({"margins": lmap}))
    with pytest.raises(ValueError, match=r"has no 'learnable_map' key \(keys: \['margins'\]\)") as info:
        load_learnable_map(str(tmp_path / "other.yaml"))
    _one_line(info)


# ----------------------------------------------------------------------------
# freeze
# ----------------------------------------------------------------------------
def test_freeze_keeps_the_values_stops_learning_and_returns_the_fixed_map() -> None:
    m = MultiMargins(4, [["learnable", 0.3], ["fixed", 0.5], ["learnable", 0.8]])
    assert not m.frozen and m.frozen_at is None
    m.learnables.grad = torch.ones(2)
    before = m.margins().detach().clone()
    fixed = m.freeze(epoch=2, step=40)
    assert m.frozen and m.frozen_at == {"epoch": 2, "step": 40}
    assert [k for k, _ in fixed] == ["fixed"] * 3 and [v for _, v in fixed] == pytest.approx([0.3, 0.5, 0.8], rel=1e-6)
    assert not m.learnables.requires_grad and m.learnables.grad is None and m.margin_parameters() == []
    assert m.margin_kinds() == ["fixed"] * 3 and m.to_learnable_map(None) == fixed
    assert torch.equal(m.margins(), before)
    assert m.freeze(epoch=5, step=99) == fixed and m.frozen_at == {"epoch": 2, "step": 40}  # again: the first record stays
    frozen_at = m.frozen_at
    assert frozen_at is not None
    frozen_at["step"] = 0  # a copy: the record cannot be changed from outside
    assert m.frozen_at == {"epoch": 2, "step": 40}

    s = SingleMargin(4, [["learnable", 0.6]])
    assert s.margin_kinds() == ["learnable"]
    assert s.freeze() == [["fixed", pytest.approx(0.6, rel=1e-6)]]
    assert s.frozen and s.frozen_at == {"epoch": None, "step": None} and not s.distance.requires_grad


def test_a_frozen_loss_does_not_move_under_its_optimiser() -> None:
    crit = OrdinalContrastiveLoss_mm(4, learnable_map=[["learnable", 0.3], ["learnable", 0.5], ["learnable", 0.8]])
    opt = torch.optim.Adam(crit.parameters(), lr=0.1)  # still holds the margins after the freeze
    x, y = torch.randn(12, 4, requires_grad=True), torch.arange(12) % 4
    crit(x, y).backward()
    opt.step()
    crit.freeze()
    before = crit.margins().detach().clone()
    for _ in range(3):
        opt.zero_grad()
        crit(x, y).backward()
        opt.step()
    assert torch.equal(crit.margins().detach(), before) and crit.learnables.grad is None


def test_an_all_fixed_map_is_fixed_but_not_frozen() -> None:
    m = MultiMargins(3, [["fixed", 0.2], ["fixed", 0.4]])
    assert not m.frozen and m.margin_kinds() == ["fixed", "fixed"] and m.margin_parameters() == []
    m.freeze(step=3)
    assert m.frozen and m.frozen_at == {"epoch": None, "step": 3}


def test_the_checkpoint_record_restores_the_frozen_state() -> None:
    torch.manual_seed(0)
    a = MultiMargins(4)
    learning = a.checkpoint_record()
    assert learning["margins_frozen"] is False and learning["frozen_at"] is None
    assert [k for k, _ in learning["learnable_map"]] == ["learnable"] * 3 and learning["margin_names"] == ["C0-C1", "C1-C2", "C2-C3"]
    a.freeze(epoch=1, step=8)
    record = yaml.safe_load(yaml.safe_dump(a.checkpoint_record()))  # plain Python
    assert record["margins_frozen"] is True and record["frozen_at"] == {"epoch": 1, "step": 8}
    b = MultiMargins(4)
    b.load_state_dict(a.state_dict())
    b.load_checkpoint_record(record)
    assert b.frozen and b.frozen_at == {"epoch": 1, "step": 8} and b.checkpoint_record() == a.checkpoint_record()
    c = MultiMargins(4)
    c.load_checkpoint_record(learning)
    assert not c.frozen and c.margin_parameters()


# ----------------------------------------------------------------------------
# YAML in/out
# ----------------------------------------------------------------------------
def test_yaml_round_trip(tmp_path: Path) -> None:
    torch.manual_seed(1)
    m = MultiMargins(5, [["learnable", None], ["fixed", 0.25], ["learnable", 0.7], ["fixed", 1.5]])
    path = tmp_path / "sub" / "cloc_margins.yaml"
    payload = m.to_yaml(path, epoch=3, global_step=30, frozen_in_this_run=True)
    text = path.read_text()
    assert text.startswith("# CLOC margins at the end of phase one; use with --model.learnable_map <this file>\n")
    loaded = yaml.safe_load(text)
    assert loaded == payload
    assert list(loaded) == ["learnable_map", "margin_mode", "n_classes", "margin_names", "epoch", "global_step", "frozen_in_this_run"]
    assert loaded["margin_mode"] == "mm" and loaded["n_classes"] == 5 and loaded["margin_names"][-1] == "C3-C4"
    assert all(kind == "fixed" and type(v) is float for kind, v in loaded["learnable_map"])
    again = MultiMargins.from_yaml(path)
    assert again.n_classes == 5 and again.margin_parameters() == [] and not again.frozen
    torch.testing.assert_close(again.margins(), m.margins().detach(), rtol=1e-6, atol=0)
    assert torch.equal(OrdinalContrastiveLoss_mm(5, learnable_map=load_learnable_map(str(path))).margins(), again.margins())
    crit = OrdinalContrastiveLoss_mm.from_yaml(path, reduction="mean")
    assert crit.reduction == "mean" and torch.equal(crit.margins(), again.margins())

    s = SingleMargin(6, [["learnable", 0.45]])
    s.to_yaml(tmp_path / "sm.yaml", epoch=0)
    s2 = OrdinalContrastiveLoss_sm.from_yaml(tmp_path / "sm.yaml")
    assert s2.n_classes == 6 and not s2.learnable
    torch.testing.assert_close(s2.margins(), torch.full((5,), 0.45), rtol=1e-6, atol=0)
    (tmp_path / "bare.yaml").write_text(yaml.safe_dump([["fixed", 0.2], ["fixed", 0.3]]))
    assert MultiMargins.from_yaml(tmp_path / "bare.yaml").n_classes == 3  # a bare mm list: len + 1 classes
    assert SingleMargin.from_yaml("[[fixed, 0.3]]", n_classes=4).n_classes == 4


def test_from_yaml_refuses_the_other_mode_and_an_unknown_class_count(tmp_path: Path) -> None:
    MultiMargins(4, [["fixed", 0.2]] * 3).to_yaml(tmp_path / "mm.yaml")
    with pytest.raises(ValueError, match=r"holds margin_mode 'mm' margins but SingleMargin is margin_mode 'sm'") as info:
        SingleMargin.from_yaml(tmp_path / "mm.yaml")
    _one_line(info)
    with pytest.raises(ValueError, match=r"pass n_classes: OrdinalContrastiveLoss_sm.from_yaml\(source, n_classes=") as info:
        OrdinalContrastiveLoss_sm.from_yaml("[[fixed, 0.3]]")
    _one_line(info)


@pytest.mark.parametrize("bad", [-math.inf, math.nan])
def test_diverged_margins_are_never_written(tmp_path: Path, bad: float) -> None:
    m = MultiMargins(4, [["learnable", 0.3], ["learnable", 0.5], ["fixed", 0.8]])
    with torch.no_grad():
        m.learnables[1] = bad  # softplus(-inf) = 0.0, softplus(nan) = nan
    with pytest.raises(ValueError, match=r"the margins are \[0\.3.*margin\(s\) \[1\] are not finite and > 0 .*Lower") as info:
        m.to_yaml(tmp_path / "m.yaml")
    _one_line(info)
    assert not (tmp_path / "m.yaml").exists()
    with pytest.raises(ValueError, match=r"^at step 9 the margins are .* Try again$"):
        m.usable_map("at step 9 the margins", "Try again")


# ----------------------------------------------------------------------------
# log
# ----------------------------------------------------------------------------
def test_values_for_logging_are_named_detached_device_scalars() -> None:
    m = MultiMargins(4, [["learnable", 0.3], ["fixed", 0.5], ["learnable", 0.8]])
    values = m.margin_values()
    assert list(values) == m.logged_names() == ["C0-C1", "C1-C2", "C2-C3"]
    assert all(v.dim() == 0 and not v.requires_grad and v.device == m.learnables.device for v in values.values())
    raw = [float(m.learnables.detach()[0]), float(m.fixed_raw[1]), float(m.learnables.detach()[1])]
    assert m.margin_scalars() == pytest.approx(dict(zip(values, [_softplus(r) for r in raw], strict=True)), rel=1e-6)
    assert m.tensorboard_layout("margins/") == {
        LAYOUT_TITLE: {"margin": ["Multiline", ["margins/C0-C1", "margins/C1-C2", "margins/C2-C3"]]}
    }
    s = SingleMargin(4, [["learnable", 0.47]])
    assert list(s.margin_values()) == ["Margin"] and s.margin_names() == ["C0-C1", "C1-C2", "C2-C3"]
    assert s.margin_scalars() == {"Margin": pytest.approx(_softplus(float(s.distance.detach()[0])), rel=1e-6)}
    assert s.tensorboard_layout() == {LAYOUT_TITLE: {"margin": ["Multiline", ["Margin"]]}}


def test_summary_writer_scalars(tmp_path: Path) -> None:
    class Writer:
        def __init__(self) -> None:
            self.scalars: list[tuple[str, float, int]] = []
            self.layouts: list[Any] = []

        def add_scalar(self, name: str, value: float, step: int) -> None:
            self.scalars.append((name, value, step))

        def add_custom_scalars(self, layout: Any) -> None:
            self.layouts.append(layout)

    m, w = MultiMargins(3, [["fixed", 0.2], ["learnable", 0.4]]), Writer()
    m.write_scalars(1)  # no writer: nothing
    m.set_writer(w)
    m.set_writer(w)  # the layout once per writer
    m.write_scalars(None)  # no step: nothing
    m.write_scalars(5)
    assert w.layouts == [m.tensorboard_layout()]
    assert [(n, s) for n, _, s in w.scalars] == [("C0-C1", 5), ("C1-C2", 5)]
    assert [v for _, v, _ in w.scalars] == pytest.approx([0.2, 0.4], rel=1e-6)
    with pytest.raises(TypeError, match="SummaryWriter"):
        m.set_writer("runs/")
