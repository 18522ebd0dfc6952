"""``python -m cloc_lightning`` = the ``cloc-lightning`` command."""

from cloc_lightning.cli import main

if __name__ == "__main__":
    main()
