"""The YAML configs shipped with cloc-lightning: find, list, read and copy them by name.

A config's *name* is its path under the repository's ``configs/`` folder without the suffix:
``cloc/demo`` is ``configs/cloc/demo.yaml``; ``cloc/demo.yaml`` and ``configs/cloc/demo.yaml``
name it too.  Where the files are:

* installed from a wheel (``pip install cloc_lightning-*.whl`` or ``pip install .``): in the
  package, ``cloc_lightning/_configs/`` (copied there by ``setup.py``'s ``build_py`` when the
  wheel is built);
* a source checkout or an editable install (``pip install -e .``): the repository's
  top-level ``configs/`` beside the package folder.

::

    from cloc_lightning.configs import list_configs, find_config, copy_config
    for cfg in list_configs("cloc"):
        print(cfg.name, cfg.description)
    path = find_config("cloc/demo").path         # a pathlib.Path to the YAML file
    copy_config("cloc/demo", "my_configs/")      # -> my_configs/cloc_demo.yaml

The command line front-end is ``cloc-lightning configs list|show|copy|path``
(:func:`configs_main`, registered in :data:`cloc_lightning.cli.commands.COMMANDS`);
``cloc-lightning fit --config configs/cloc/demo.yaml`` falls back to the packaged file when no such file exists where it
runs (:func:`packaged_config_for`).  This module imports nothing else from the package.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

__all__ = [
    "ShippedConfig",
    "ConfigNotFoundError",
    "ConfigCopyError",
    "configs_root",
    "list_configs",
    "find_config",
    "copy_config",
    "copy_name",
    "config_name",
    "packaged_config_for",
    "configs_main",
]

#: the package folder the wheel carries the configs in (``cloc_lightning/_configs``)
PACKAGED_DIR = Path(__file__).resolve().parent / "_configs"
#: the repository's top-level ``configs/`` (a source checkout or an editable install)
REPOSITORY_DIR = Path(__file__).resolve().parent.parent / "configs"

_SUFFIXES = (".yaml", ".yml")
#: longest description ``configs list`` shows (the first sentence of the header, shortened at a word)
_DESCRIPTION_CHARS = 100


class ConfigCopyError(PermissionError):
    """``configs copy`` cannot write its destination (a read-only folder or file system)."""


class ConfigNotFoundError(FileNotFoundError):
    """A config name that is not among the shipped configs (the message lists close matches)."""


@dataclass(frozen=True)
class ShippedConfig:
    """One shipped config: ``name`` (``cloc/demo``), ``path`` to its YAML file and the one-line ``description``."""

    name: str
    path: Path

    @property
    def group(self) -> str:
        """The folder it lives in (``cloc`` for ``cloc/demo``): one per method or tool."""
        return self.name.split("/", 1)[0] if "/" in self.name else ""

    @property
    def description(self) -> str:
        """The first sentence of the file's header comment, shortened to about 100 characters ('' without a header)."""
        return _describe(self.path.read_text(encoding="utf-8"))

    def text(self) -> str:
        """The YAML file's content."""
        return self.path.read_text(encoding="utf-8")


def configs_root() -> Path:
    """The folder holding the shipped configs: the packaged ``_configs`` when present (wheel), else the repository's ``configs/``.

    Raises :class:`FileNotFoundError` naming both places when neither exists (a package
    installed without its data).
    """
    for folder in (PACKAGED_DIR, REPOSITORY_DIR):
        if folder.is_dir():
            return folder
    raise FileNotFoundError(
        f"the shipped configs were not found: neither {PACKAGED_DIR} (installed from a wheel) nor {REPOSITORY_DIR} "
        "(a source checkout or `pip install -e .`) exists. Reinstall cloc-lightning from a wheel built with "
        "`python -m build`, or install the repository with `pip install -e .`."
    )


def list_configs(group: str | None = None) -> list[ShippedConfig]:
    """Every shipped config, sorted by name; ``group`` (``cloc``, ``relic``, ...) keeps one folder's.

    Raises :class:`ValueError` listing the groups when ``group`` names none of them.
    """
    root = configs_root()
    found = sorted(
        (ShippedConfig(_name_of(path.relative_to(root)), path) for path in root.rglob("*") if path.suffix in _SUFFIXES and path.is_file()),
        key=lambda c: c.name,
    )
    if group is None:
        return found
    wanted = group.strip().strip("/")
    chosen = [c for c in found if c.group == wanted]
    if not chosen:
        groups = sorted({c.group for c in found})
        raise ValueError(f"no config group {group!r}; the groups are: {', '.join(groups)}")
    return chosen


def config_name(name: str) -> str:
    """The canonical name for ``name``: ``configs/cloc/demo.yaml``, ``./cloc/demo.yml``, ``cloc/demo`` -> ``cloc/demo``."""
    text = name.strip().replace("\\", "/")
    while text.startswith("./"):
        text = text[2:]
    if text.startswith("configs/"):
        text = text[len("configs/") :]
    for suffix in _SUFFIXES:
        if text.endswith(suffix):
            text = text[: -len(suffix)]
            break
    return text.strip("/")


def find_config(name: str) -> ShippedConfig:
    """The shipped config called ``name`` (any form :func:`config_name` accepts).

    Raises :class:`ConfigNotFoundError` with the closest names and a pointer to
    ``cloc-lightning configs list`` when there is none.
    """
    wanted = config_name(name)
    configs = list_configs()
    for cfg in configs:
        if cfg.name == wanted:
            return cfg
    names = [c.name for c in configs]
    close = difflib.get_close_matches(wanted, names, n=4, cutoff=0.5)
    close += [n for n in names if n not in close and wanted and (n.startswith(wanted + "/") or n.endswith("/" + wanted))][: 4 - len(close)]
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise ConfigNotFoundError(f"no shipped config named {name!r}; {hint}`cloc-lightning configs list` shows them all")


def copy_name(name: str) -> str:
    """The file name a copy of the shipped config ``name`` gets in a folder: ``<group>_<name>.yaml`` (``cloc_demo.yaml``).

    Shipped configs of different groups share file names (``cloc/demo.yaml``, ``corn/demo.yaml``), so a copy keeps
    its group in its name: copies of any two shipped configs into one folder never collide.
    """
    cfg = find_config(name)
    return cfg.name.replace("/", "_") + cfg.path.suffix


def copy_config(name: str, dest: str | os.PathLike[str] = ".", force: bool = False) -> Path:
    """Copy the shipped config ``name`` to ``dest`` and return the path written.

    ``dest`` is a folder (an existing one, or any path ending in ``/``: the file is named
    ``<group>_<name>.yaml``, e.g. ``cloc_demo.yaml``, :func:`copy_name`) or a file path; missing parent
    folders are created.  An existing file is only replaced with ``force=True``: otherwise
    :class:`FileExistsError` names the flag.  A destination that cannot be written raises
    :class:`ConfigCopyError` (a ``PermissionError``) naming it and the fix.
    """
    cfg = find_config(name)
    target = Path(dest)
    if target.is_dir() or str(dest).endswith(("/", os.sep)):
        target = target / copy_name(cfg.name)
    if target.exists() and not force:
        raise FileExistsError(f"{target} already exists; pass --force to overwrite it (force=True in Python), or give another destination")
    if target.is_dir():
        raise IsADirectoryError(f"{target} is a folder")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(cfg.path, target)
    except OSError as e:
        reason = (e.strerror or type(e).__name__).lower()
        raise ConfigCopyError(
            f"cannot write {target}: {reason} (in {target.parent}); give a folder you can write to: "
            f"cloc-lightning configs copy {cfg.name} <folder> (copy_config({cfg.name!r}, '<folder>') in Python)"
        ) from e
    return target


def packaged_config_for(value: str) -> ShippedConfig | None:
    """The shipped config a missing ``--config`` path names, or ``None``.

    Used by the ``cloc-lightning`` entry point when ``--config value`` is not an existing
    file: a relative path such as ``configs/cloc/demo.yaml`` (the README's form, run outside
    the repository after a wheel install), ``cloc/demo.yaml`` or ``cloc/demo`` names the
    shipped config.  Absolute paths, paths with ``..``, inline YAML and existing files are
    never replaced.
    """
    text = value.strip()
    if not text or os.path.exists(text) or os.path.isabs(text) or "\n" in text:
        return None
    parts = PurePosixPath(text.replace("\\", "/")).parts
    if ".." in parts or not re.fullmatch(r"[\w./\\-]+", text):
        return None
    if "/" not in config_name(text):
        return None  # a bare file name (demo.yaml) is more likely a typo than a group-less config
    try:
        return find_config(text)
    except FileNotFoundError:
        return None


def _name_of(relative: Path) -> str:
    return relative.with_suffix("").as_posix()


def _describe(text: str) -> str:
    """First sentence of the leading ``#`` comment block (up to a blank comment line or an indented command)."""
    words: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped.startswith("#"):
            break
        body = stripped[1:]
        if not body.strip() or body.startswith("   "):
            if words:
                break
            continue
        words.extend(body.split())
    joined = " ".join(words)
    match = re.search(r"(?<!\bal)(?<!\be\.g)(?<!\bi\.e)(?<!\b[A-Z])\.(\s|$)", joined)
    sentence = joined[: match.start() + 1] if match else joined
    if len(sentence) <= _DESCRIPTION_CHARS:
        return sentence
    cut = sentence[: _DESCRIPTION_CHARS - 1].rsplit(" ", 1)[0].rstrip(",;:(")
    return cut + "…"


# ---------------------------------------------------------------- the `cloc-lightning configs` command
_CONFIGS_EPILOG = """\
NAME is a config's path under configs/ without the suffix: cloc/demo (also cloc/demo.yaml or
configs/cloc/demo.yaml).  Run one as it is, or copy it and edit:
  cloc-lightning fit --config "$(cloc-lightning configs path cloc/demo)"
  cloc-lightning configs copy cloc/demo && cloc-lightning fit --config cloc_demo.yaml
"""


def configs_main(argv: list[str] | None = None) -> list[ShippedConfig] | str | Path:
    """List, show, copy or locate the shipped YAML configs (configs list|show|copy|path NAME).

    ::

        cloc-lightning configs list [--group GROUP]
        cloc-lightning configs show NAME
        cloc-lightning configs copy NAME [DEST] [--force]
        cloc-lightning configs path NAME

    ``NAME`` is ``cloc/demo``, ``cloc/demo.yaml`` or ``configs/cloc/demo.yaml``; the configs are
    the repository's ``configs/`` folder, carried in the wheel as package data
    (:mod:`cloc_lightning.configs`).  ``copy`` writes ``DEST/cloc_demo.yaml`` (``<group>_<name>.yaml``, so that
    copies of shipped configs never collide) when ``DEST`` is a folder (default: the current one) or the file ``DEST`` otherwise, and
    never overwrites an existing file without ``--force``.  Returns the configs listed, the YAML shown or the path
    copied to / printed.  Unknown names raise
    :class:`~cloc_lightning.configs.ConfigNotFoundError` with the closest names (one
    ``cloc-lightning: error:`` line, exit code 1, from the command line).
    """
    parser = argparse.ArgumentParser(
        prog="cloc-lightning configs",
        description="The YAML configs shipped with cloc-lightning (the repository's configs/ folder, packaged in the wheel).",
        epilog=_CONFIGS_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="action", metavar="{list,show,copy,path}")
    sub.required = True
    p_list = sub.add_parser("list", help="every config name with a one-line description from its header comment")
    p_list.add_argument("--group", default=None, help="only this folder's configs (cloc, ce, relic, supcon, ...)")
    p_show = sub.add_parser("show", help="print a config's YAML")
    p_show.add_argument("name", help="cloc/demo, cloc/demo.yaml or configs/cloc/demo.yaml")
    p_copy = sub.add_parser("copy", help="write a config to a folder (default: the current one) or a file, to edit it")
    p_copy.add_argument("name", help="cloc/demo, cloc/demo.yaml or configs/cloc/demo.yaml")
    p_copy.add_argument(
        "dest", nargs="?", default=".", help="a folder (the copy is named <group>_<name>.yaml: cloc_demo.yaml) or a file path; default '.'"
    )
    p_copy.add_argument("--force", action="store_true", help="overwrite an existing file")
    p_path = sub.add_parser("path", help='print the config file\'s path (for --config "$(cloc-lightning configs path NAME)")')
    p_path.add_argument("name", help="cloc/demo, cloc/demo.yaml or configs/cloc/demo.yaml")
    args = parser.parse_args(argv)

    if args.action == "list":
        configs = list_configs(args.group)
        width = max(len(c.name) for c in configs) + 2
        print("\n".join(f"{c.name:<{width}}{c.description}".rstrip() for c in configs))
        return configs
    if args.action == "show":
        text = find_config(args.name).text()
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return text
    if args.action == "copy":
        cfg = find_config(args.name)
        target = copy_config(cfg.name, args.dest, force=args.force)
        print(f"copied {cfg.name} to {target} (edit it, then give it to --config)")
        return target
    path = find_config(args.name).path
    print(path)
    return path
