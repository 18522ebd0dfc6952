"""Run every benchmark in sequence and write ``benchmarks/results/README.md``.

::

    python -m benchmarks                          # all benchmarks, full size; writes results/*.md and README.md
    python -m benchmarks --quick                  # smoke run: small sizes, few repeats, writes nothing
    python -m benchmarks --only supcon            # one benchmark (repeat --only, or comma-separate, for more)
    python -m benchmarks --combine                # rebuild README.md from the existing results/*.md only
    python -m benchmarks --list                   # the benchmarks found

A benchmark is a module ``benchmarks/bench_<name>.py`` with a ``run(quick: bool = False)``
function that measures, writes ``results/<name>.{md,json}`` (full runs only) and returns
``(markdown, data)``.  The known ones run first, in :data:`ORDER`; any other
``bench_*.py`` follows in alphabetical order.  Each runs in this process, one after the
other (memory measurements start their own fresh processes, see ``harness.py``), so
the machine is not shared between two benchmarks.

``README.md`` combines the newest ``results/<name>.md`` of every benchmark (those run now
and, with ``--only``, those measured earlier: each table keeps its own date, device and
command line), under a header with this run's command and environment.  A benchmark
that fails is reported and the others still run; the exit status is then 1.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from benchmarks.harness import RESULTS_DIR, environment, markdown_table

BENCH_DIR = Path(__file__).resolve().parent

#: the benchmarks in the order they run and appear in README.md, with their section titles
ORDER: dict[str, str] = {
    "cloc": "CLOC loss (ours vs the official algorithm)",
    "supcon": "SupCon loss (ours vs pytorch-metric-learning and SupContrast)",
    "sigmoid": "Sigmoid (ReLIC / SigLIP) loss (ours vs open_clip and the seed)",
    "rnc": "Rank-N-Contrast loss (ours vs the authors' loop; SupCon beside it)",
    "lightning_overhead": "Lightning step overhead and EMA update",
    "throughput": "Training-step throughput (ours vs plain PyTorch vs lightly) and data pipeline",
    "data_path": "The data path inside Trainer.fit: loader path vs decode once + augment on the device",
    "store_size": "Stored image size and the sharpness of the training views (gradient energy vs the original files)",
    "test_tier": "The fast test tier's wall time beside the tier that was too slow (issue 51)",
    "streaming": "LitData chunks (data.stream_from) vs data.cache: disk vs the loader path: bytes per image, loader items/s per core",
}


def available() -> list[str]:
    """Names of the benchmarks present (``bench_<name>.py``): the known ones in :data:`ORDER`, then the rest."""
    found = {p.stem[len("bench_") :] for p in BENCH_DIR.glob("bench_*.py")}
    return [n for n in ORDER if n in found] + sorted(found - set(ORDER))


def _select(only: list[str] | None, names: list[str]) -> list[str]:
    if not only:
        return names
    wanted = [w.strip() for item in only for w in item.split(",") if w.strip()]
    unknown = [w for w in wanted if w not in names]
    if unknown:
        raise SystemExit(f"unknown benchmark(s) {unknown}; available: {', '.join(names)} (see --list)")
    return [n for n in names if n in wanted]


def run_one(name: str, quick: bool) -> tuple[str, dict[str, Any]]:
    """Import ``benchmarks.bench_<name>`` and call its ``run(quick=...)``."""
    module = importlib.import_module(f"benchmarks.bench_{name}")
    if not callable(getattr(module, "run", None)):
        raise TypeError(f"benchmarks/bench_{name}.py has no run(quick) function")
    return module.run(quick=quick)


def combined_readme(command: str, sections: dict[str, str], status: dict[str, str]) -> str:
    """README.md text: header (command, environment, status of each benchmark), then every section."""
    env = environment()
    env_rows = [[k, "-" if v is None else f"{len(v)} file(s)" if isinstance(v, list) else str(v)] for k, v in env.items()]
    status_rows = [[f"[{n}](#{n.replace('_', '-')})" if n in sections else n, ORDER.get(n, n), s] for n, s in status.items()]
    parts = [
        f"<!-- produced by: {command} -->\n",
        "# Benchmarks\n",
        f"Produced by `{command}` (one benchmark alone: `python -m benchmarks.bench_<name>`; a smoke run: "
        "`python -m benchmarks --quick`). Every benchmark times the implementations it compares side by side in "
        "one process (interleaved repeats, medians, inter-quartile ranges) and measures peak memory in a fresh "
        "process per implementation (see `benchmarks/harness.py`). Each table below states when, on which "
        "device and with how many threads it was measured.\n",
        "## Environment of this run\n",
        markdown_table(["", ""], env_rows) + "\n",
        "## Contents\n",
        markdown_table(["benchmark", "what", "this run"], status_rows) + "\n",
    ]
    for name, md in sections.items():
        parts.append(f'<a id="{name.replace("_", "-")}"></a>\n\n## {ORDER.get(name, name)}\n')
        parts.append(_demote(md).strip() + "\n")
    return "\n".join(parts)


def _demote(md: str) -> str:
    """Drop a result file's ``produced by`` comment into plain text and keep its headings below ``##``."""
    out = []
    for line in md.splitlines():
        if line.startswith("<!-- produced by:"):
            cmd = line[len("<!-- produced by:") :].rstrip("->").strip()
            out.append(f"Command: `{cmd}`")
            continue
        if line.startswith("#") and not line.startswith("###"):
            line = "#" + line
        out.append(line)
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: small sizes, few repeats; writes no results")
    parser.add_argument("--only", action="append", metavar="NAME", help="run only these benchmarks (repeatable or comma-separated)")
    parser.add_argument("--combine", action="store_true", help="run nothing; rebuild README.md from the existing results/*.md")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where to write the combined README (default results/README.md; with --quick, nothing unless given)",
    )
    args = parser.parse_args(argv)
    names = available()
    if args.list:
        for n in names:
            print(f"{n:20s} {ORDER.get(n, '')}")
        return 0
    selected = _select(args.only, names)
    command = "python -m benchmarks" + (" --quick" if args.quick else "") + "".join(f" --only {n}" for n in (args.only or []))
    if args.combine:
        command = "python -m benchmarks --combine"
        selected = []

    fresh: dict[str, str] = {}
    status: dict[str, str] = {}
    failed = False
    for name in selected:
        print(f"== {name}: {ORDER.get(name, name)} ({'quick' if args.quick else 'full'})", flush=True)
        t0 = time.perf_counter()
        try:
            md, _ = run_one(name, args.quick)
        except Exception:  # noqa: BLE001 - report and continue with the others
            failed = True
            status[name] = "FAILED (see the log of the command)"
            traceback.print_exc()
            continue
        elapsed = time.perf_counter() - t0
        fresh[name] = md
        status[name] = f"{'smoke run' if args.quick else 'measured now'} ({elapsed:.0f} s)"
        print(md, flush=True)

    sections: dict[str, str] = {}
    for name in names:
        if args.quick:
            if name in fresh:
                sections[name] = fresh[name]
            continue
        path = RESULTS_DIR / f"{name}.md"
        if path.is_file():
            sections[name] = path.read_text()
            status.setdefault(name, "from an earlier run (date in its table)")
        else:
            status.setdefault(name, "never measured: run `python -m benchmarks --only " + name + "`")
    out = args.out if args.out is not None else (None if args.quick else RESULTS_DIR / "README.md")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(combined_readme(command, sections, {n: status[n] for n in names if n in status}))
        print(f"wrote {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
