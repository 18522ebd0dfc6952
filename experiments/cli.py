"""``python -m experiments``: the command line of the runner (``--help`` lists the options)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from experiments import runner
from experiments.paths import DEFAULT_DATA, DEFAULT_OUT, REPO
from experiments.tables import TABLES

__all__ = ["PROG", "main"]

#: the command that runs a table
PROG = "python -m experiments"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse ``argv`` (default: the command line), run or resume the table, and return its JSON payload."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Reproducible experiment tables on real data: one command per table.",
        epilog="The tables, their scale and how to read them: docs/results.md (the runner section).",
    )
    parser.add_argument("table", choices=sorted(TABLES))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--quick", action="store_true", help="tiny settings for a smoke test (numbers are not results)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where <table>.md and <table>.json go")
    parser.add_argument(
        "--runs-dir", type=Path, default=None, help="run folders (default runs/experiments/<table>[_quick]); records name them $RUNS"
    )
    parser.add_argument("--rows", nargs="+", default=None, help="only these row keys")
    parser.add_argument("--data-root", type=Path, default=DEFAULT_DATA, help="folder holding utkface/ and cifar10/; records name it $DATA")
    parser.add_argument("--rerun", action="store_true", help="repeat runs that already have a result.json")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per subprocess")
    parser.add_argument("--keep-checkpoints", action="store_true")
    parser.add_argument("--subprocess", action="store_true", help="one fresh interpreter per command instead of in-process")
    parser.add_argument("--deadline", default=None, help="HH:MM (UTC) or ISO time: start no run after it, stop a running one at it")
    parser.add_argument(
        "--restore-runs",
        type=Path,
        default=None,
        metavar="JSON",
        help="first put the finished runs recorded in this <table>.json back into --runs-dir (e.g. on a new machine)",
    )
    parser.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="overrides appended to every fit (must come last)")
    args = parser.parse_args(argv)
    runner.IN_PROCESS = not args.subprocess
    os.chdir(REPO)  # the configs' relative paths
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return runner.run_table(
        args.table,
        args.seeds,
        args.quick,
        args.out,
        args.runs_dir,
        args.rows,
        args.data_root,
        args.extra,
        args.rerun,
        args.timeout,
        args.keep_checkpoints,
        deadline=args.deadline,
        restore=args.restore_runs,
    )
