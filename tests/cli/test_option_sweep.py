"""Every option of ``cloc-lightning fit`` given a value of the wrong type, a near miss, an empty value or the wrong
kind of file stops before the first step with one short line naming the option or the file (issue 51, item 1).

The cases are generated from the signatures the parser is built from (``benchmarks/option_sweep.py``), not listed
here; the audit runs the same cases through the command (``python -m benchmarks.bad_inputs``)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightning.pytorch import Trainer

from benchmarks.option_sweep import ACCEPTED, SKIP, Case, _params, generate, judge, representatives, run_in_process, write_fixtures

WORK = Path(tempfile.mkdtemp(prefix="cloc-option-sweep-"))
CASES = generate(WORK)


@pytest.fixture(scope="module")
def fixtures() -> Iterator[Path]:
    write_fixtures(WORK)
    yield WORK
    shutil.rmtree(WORK, ignore_errors=True)


FAST = representatives(CASES)


def _check(case: Case, tmp_path: Path) -> None:
    result = run_in_process(case, tmp_path)
    verdict = judge(case, result)
    assert verdict == "good", f"{verdict}: cloc-lightning {' '.join(case.argv)}\n{result.stderr[-3000:]}"
    if (case.option, case.value) not in ACCEPTED:
        assert not any(tmp_path.iterdir()), "a refused command left files behind"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", FAST, ids=[c.id for c in FAST])
def test_a_bad_value_of_any_option_is_one_line_naming_it(case: Case, fixtures: Path, tmp_path: Path) -> None:
    _check(case, tmp_path)


@pytest.mark.slow  # the rest of the generated cases (the same checks on more options): the long tier
@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", [c for c in CASES if c not in FAST], ids=[c.id for c in CASES if c not in FAST])
def test_a_bad_value_of_every_other_option_is_one_line_naming_it(case: Case, fixtures: Path, tmp_path: Path) -> None:
    _check(case, tmp_path)


def test_the_sweep_covers_every_trainer_argument() -> None:
    swept = {c.option for c in CASES}
    missing = [f"--trainer.{n}" for n, _, _ in _params(Trainer) if f"--trainer.{n}" not in swept | SKIP]
    assert not missing, f"Trainer arguments with no generated bad value: {missing}"
