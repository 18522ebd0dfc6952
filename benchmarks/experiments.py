"""The experiment runner moved to its own package, :mod:`experiments`: ``python -m experiments <table> ...``.

Running this module prints the new command, with the arguments it was given, in one line on stderr and exits with 2.
"""

from __future__ import annotations

import shlex
import sys

__all__ = ["moved"]


def moved(argv: list[str]) -> str:
    """The one line that names the new command for ``argv`` (the arguments after ``python -m benchmarks.experiments``)."""
    return (
        f"python -m benchmarks.experiments: the runner moved to its own package; run `{shlex.join(['python', '-m', 'experiments', *argv])}` "
        "(same arguments; docs/results.md)"
    )


if __name__ == "__main__":
    print(moved(sys.argv[1:]), file=sys.stderr)
    raise SystemExit(2)
