"""``python -m experiments <table> ...``: see :mod:`experiments` and ``--help``."""

from experiments.cli import main

if __name__ == "__main__":
    main()
