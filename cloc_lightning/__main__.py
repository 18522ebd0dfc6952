"""``python -m cloc_lightning`` = the ``cloc-lightning`` command (its console-script entry point too).

``cloc-lightning configs ...`` needs neither torch nor Lightning, so it is answered here without
importing them (a fraction of a second instead of several seconds); every other command goes to
:func:`cloc_lightning.cli.main`.
"""

from __future__ import annotations

import os
import sys


def main(args: list[str] | None = None) -> None:
    """Entry point of ``cloc-lightning``: the ``configs`` command directly, everything else through the CLI."""
    argv = sys.argv[1:] if args is None else list(args)
    if argv[:1] == ["configs"]:
        from cloc_lightning._logging import debug_requested, exit_with_error
        from cloc_lightning.configs import configs_main

        debug = debug_requested(argv)
        try:
            configs_main([a for a in argv[1:] if a != "--debug"])
        except BrokenPipeError:  # `cloc-lightning configs list | head`: the reader left; say nothing more
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise SystemExit(1) from None
        except (ValueError, FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError, PermissionError) as e:
            if debug:
                raise
            exit_with_error(e)
        return
    from cloc_lightning.cli import main as cli_main

    cli_main(args)


if __name__ == "__main__":
    sys.argv[0] = "cloc-lightning"  # usage and error lines name the command, not "__main__.py"
    main()
