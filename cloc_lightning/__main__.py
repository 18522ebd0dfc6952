"""``python -m cloc_lightning`` = the ``cloc-lightning`` command (its console-script entry point too).

``cloc-lightning configs ...`` needs neither torch nor Lightning, so it is answered here without
importing them (a fraction of a second instead of several seconds); every other command goes to
:func:`cloc_lightning.cli.main`.
"""

from __future__ import annotations

import os
import sys


def import_from_working_folder() -> None:
    """Put the working folder first on ``sys.path``, as ``python -m cloc_lightning`` does.

    The installed command's ``sys.path`` starts with the folder of its script (the environment's
    ``bin/``), so ``--model my_pkg.models.MyModule`` of a project folder would not import without it.
    """
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def main(args: list[str] | None = None) -> None:
    """Entry point of ``cloc-lightning``: the ``configs`` command directly, everything else through the CLI."""
    argv = sys.argv[1:] if args is None else list(args)
    import_from_working_folder()
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
    try:
        from cloc_lightning.cli import main as cli_main
    except (RuntimeError, ImportError, OSError) as e:
        from cloc_lightning._logging import debug_requested

        problem = install_mismatch(e)
        if problem is None or debug_requested(argv):
            raise
        print(f"cloc-lightning: error: {problem}\n(--debug shows the traceback)", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    cli_main(args)


def _build(version: str) -> str:
    """What a torch/torchvision version's local part says about its build."""
    local = version.partition("+")[2]
    if local == "cpu":
        return "a CPU-only build"
    if local.startswith("cu"):
        return f"a CUDA {local[2:-1]}.{local[-1:]} build" if len(local) > 3 else "a CUDA build"
    if local.startswith("rocm"):
        return "a ROCm build"
    return "a CUDA build" if sys.platform.startswith("linux") else "a PyPI build"  # PyPI's Linux wheels are CUDA builds


def install_mismatch(exc: BaseException) -> str | None:
    """One line naming torch's and torchvision's versions and the fix, when ``exc`` says they do not fit; else ``None``.

    A CPU-only torch beside a CUDA torchvision (the CPU index could not be reached), or the two of
    different releases, fails at ``import torchvision`` with "operator torchvision::nms does not exist"
    (or another ``torchvision::`` operator), which names neither package.
    """
    text = str(exc)
    if "torchvision::" not in text:
        return None
    from importlib import metadata

    versions = {}
    for name in ("torch", "torchvision"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "(not installed)"
    torch_v, vision_v = versions["torch"], versions["torchvision"]
    index = "https://download.pytorch.org/whl/cpu" if torch_v.endswith("+cpu") else None
    fix = (
        "pip install --force-reinstall torch torchvision --index-url https://download.pytorch.org/whl/cpu (CPU-only) "
        "or pip install --force-reinstall torch torchvision (PyPI's builds)"
    )
    if index is None:
        fix = (
            "pip install --force-reinstall torch torchvision (PyPI's builds) or both from the same index, e.g. "
            "--index-url https://download.pytorch.org/whl/cpu"
        )
    return (
        f"torchvision {vision_v} ({_build(vision_v)}) does not fit torch {torch_v} ({_build(torch_v)}): "
        f"{text.strip().splitlines()[0]}; install a matching pair from one index: {fix}"
    )


if __name__ == "__main__":
    sys.argv[0] = "cloc-lightning"  # usage and error lines name the command, not "__main__.py"
    main()
