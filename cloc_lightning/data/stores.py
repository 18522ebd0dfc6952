"""Where decode-once stores live, who builds them, and how users see and remove them.

A store is a folder (``images.u8``, the raw ``uint8 [N, 3, S, S]`` pixels; ``meta.npz``, the sizes and
readable flags; ``info.json``, what it was built from) in one of two roots:

* ``data.cache: disk``: ``data.cache_dir`` (default :func:`default_cache_dir`), one folder per
  *key*, the SHA-256 of the format, the stored layout, the labels and the source's
  :meth:`~cloc_lightning.data.datasets.LabelledDataset.store_identity` (files: path, size,
  modification and change times, inode; arrays: their bytes; subsets: their parent and indices).
  Reused by later runs; ``last_used`` is touched on every use.
* ``data.cache: memory``: :func:`shm_root` (``/dev/shm``, a RAM file system), one folder per run and
  split, built once per node and mapped by every process of the run there; the last process that
  maps it removes it (:func:`hold`), and a folder that no live process maps is removed by the next
  build (a run killed with ``SIGKILL``).

**Who builds** (:class:`StoreGroup`, the processes of a DDP run): a disk store is built by global
rank 0 first, then by local rank 0 of any node that still does not see it complete (a node-local
``cache_dir``); a memory store by local rank 0 of every node.  Everyone else waits at a collective,
so correctness never depends on ``flock`` across machines (NFS, Lustre); between independent runs on
one machine an ``flock`` serialises builds, and each build writes a folder of its own
(``<key>.partial-<host>-<pid>``) renamed into place when complete, so a partial store is never read.

``cloc-lightning cache list`` and ``cloc-lightning cache remove`` (:func:`cache_main`) show and remove
stores of both kinds.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import json
import math
import os
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cloc_lightning._logging import print_line
from cloc_lightning.data.errors import DataConfigError

__all__ = [
    "StoreGroup",
    "default_cache_dir",
    "shm_root",
    "list_stores",
    "remove_stores",
    "stores_summary",
    "hold",
    "release",
    "sweep_unused",
    "cache_main",
]

#: the file every process that maps a memory store holds a shared ``flock`` on
USERS = "users.lock"


def default_cache_dir() -> str:
    """``$CLOC_CACHE_DIR``, else ``$XDG_CACHE_HOME/cloc_lightning/images``, else ``~/.cache/cloc_lightning/images``."""
    env = os.environ.get("CLOC_CACHE_DIR")
    if env:
        return os.path.expanduser(env)
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "cloc_lightning", "images")


def shm_root() -> Path | None:
    """The folder of ``data.cache: memory`` stores: ``$CLOC_SHM_DIR``, else ``/dev/shm/cloc_lightning-<uid>``; ``None`` without ``/dev/shm``."""
    env = os.environ.get("CLOC_SHM_DIR")
    if env:
        return Path(os.path.expanduser(env))
    if not os.path.isdir("/dev/shm"):
        return None
    return Path("/dev/shm") / f"cloc_lightning-{os.getuid()}"


# ----------------------------------------------------------------------------
# the processes that share a store
# ----------------------------------------------------------------------------
def _one(value: Any) -> list[Any]:
    return [value]


@dataclass
class StoreGroup:
    """The processes of one run that share its stores: ranks, and two collectives over all of them.

    ``gather(obj)`` returns every process's ``obj`` (in rank order) and is a barrier;
    ``broadcast(obj)`` returns global rank 0's.  The default is one process on its own.
    """

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    gather: Callable[[Any], list[Any]] = field(default=_one)
    broadcast: Callable[[Any], Any] = field(default=lambda v: v)

    @classmethod
    def of_trainer(cls, trainer: Any) -> StoreGroup:
        """The trainer's processes (one process without a trainer or outside a process group)."""
        import torch.distributed as dist

        if trainer is None:
            return cls()
        strategy = trainer.strategy
        world = int(getattr(trainer, "world_size", 1))
        if world <= 1 or not (dist.is_available() and dist.is_initialized()):
            return cls()

        def gather(value: Any) -> list[Any]:
            out: list[Any] = [None] * world
            dist.all_gather_object(out, value)
            return out

        return cls(int(trainer.global_rank), world, int(trainer.local_rank), gather, strategy.broadcast)

    def agree(self, problem: str | None) -> None:
        """A barrier at which every process learns the first problem any of them met, and raises it."""
        problems = [p for p in self.gather(problem) if p]
        if problems:
            raise DataConfigError(problems[0])


# ----------------------------------------------------------------------------
# locks, folders, users
# ----------------------------------------------------------------------------
@contextlib.contextmanager
def locked(path: Path, waiting: str | None = None) -> Iterator[None]:
    """An exclusive ``flock`` on ``path``: other processes of this machine building the same store wait here (saying ``waiting``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            have = True
        except OSError as e:
            have = e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK)  # held by another process: wait for it
            if have:
                if waiting:
                    print_line(None, waiting)
                fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            # else: no flock on this file system (some NFS mounts); a run's own processes still build in turn
            # (StoreGroup), and each build renames a folder of its own into place
        try:
            yield
        finally:
            if have:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def partial_name(key: str) -> str:
    """The folder a build of ``key`` writes before its rename: unique per machine and process."""
    return f"{key}.partial-{socket.gethostname()}-{os.getpid()}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_dead_partials(root: Path, key: str = "*") -> None:
    """Remove this machine's unfinished builds (of ``key``; default every key) whose process is gone (another machine's are left alone)."""
    host = socket.gethostname()
    for stale in root.glob(f"{key}.partial-*"):
        tail = stale.name.split(".partial-", 1)[1]
        owner, _, pid = tail.rpartition("-")
        if owner == host and pid.isdigit() and not _pid_alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)


#: open files of the memory stores this process maps (the shared flock lives as long as the file is open)
_HELD: dict[str, Any] = {}


#: the held folders that are disk stores (kept when their last user leaves)
_KEEP: set[str] = set()


def hold(folder: Path, keep: bool = False) -> None:
    """Mark ``folder`` as mapped by this process until :func:`release` or the process's end.

    A memory store (``keep`` false) is removed by its last user; a disk store (``keep``) stays, but
    ``cloc-lightning cache remove`` leaves it alone while anyone holds it.
    """
    key = str(folder)
    if key in _HELD:
        return
    f = open(folder / USERS, "a+")  # noqa: SIM115 - held open on purpose: the lock lives with the file
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_SH)
    except OSError:  # a file system without flock (some NFS mounts): the store is used, only not marked in use
        f.close()
        return
    _HELD[key] = f
    if keep:
        _KEEP.add(key)
    if len(_HELD) == 1:
        import atexit

        atexit.register(_release_all)


def release(folder: Path) -> bool:
    """Stop holding ``folder``; remove it (a memory store) when no other process maps it.  Returns whether it was removed.

    Loader workers forked from this process share its open file, so a store stays while they live.
    """
    key = str(folder)
    f = _HELD.pop(key, None)
    if f is not None:
        f.close()  # closing (not LOCK_UN) keeps the lock of forked children that share the file
    if key in _KEEP:
        _KEEP.discard(key)
        return False
    return _remove_if_unused(folder)


def _release_all() -> None:
    for key in list(_HELD):
        with contextlib.suppress(OSError):
            release(Path(key))


def _remove_if_unused(folder: Path) -> bool:
    try:
        f = open(folder / USERS, "a+")  # noqa: SIM115
    except OSError:
        return False
    with f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                return False
            raise
        shutil.rmtree(folder, ignore_errors=True)
        return True


def in_use(folder: Path) -> bool:
    """Whether a live process maps ``folder`` (a memory store: someone holds its users lock)."""
    path = folder / USERS
    if not path.is_file():
        return False
    with open(path, "a+") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        return False


def sweep_unused(root: Path, min_age_s: float = 5.0) -> list[str]:
    """Remove memory stores (and unfinished builds) in ``root`` that no live process maps; return their names.

    Folders younger than ``min_age_s`` are left alone: a build takes its lock within microseconds of
    making its folder, so only that moment is protected, and a run killed a few seconds ago is swept.
    """
    removed: list[str] = []
    if not root.is_dir():
        return removed
    now = time.time()
    for folder in root.iterdir():
        if folder.suffix == ".lock" and not (root / folder.stem).exists():  # a build's lock left by a killed run
            with contextlib.suppress(OSError):
                if now - folder.stat().st_mtime >= min_age_s:
                    folder.unlink()
            continue
        if not folder.is_dir():
            continue
        try:
            if now - folder.stat().st_mtime < min_age_s:
                continue
        except OSError:
            continue
        if not (folder / USERS).is_file() or not in_use(folder):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder.name)
    return removed


# ----------------------------------------------------------------------------
# seeing and removing stores
# ----------------------------------------------------------------------------
def _size_of(folder: Path) -> int:
    total = 0
    for f in folder.iterdir():
        with contextlib.suppress(OSError):
            total += f.stat().st_size
    return total


def _last_used(folder: Path) -> float:
    for name in ("last_used", "info.json"):
        with contextlib.suppress(OSError):
            return (folder / name).stat().st_mtime
    return folder.stat().st_mtime


def list_stores(cache_dir: str | None = None, memory: bool = True) -> list[dict[str, Any]]:
    """Every store in ``cache_dir`` (default :func:`default_cache_dir`) and, with ``memory``, in :func:`shm_root`.

    One dict per store: ``kind`` (``disk``/``memory``), ``key``, ``path``, ``bytes``, ``last_used``
    (seconds since the epoch), ``complete``, ``in_use`` (a process of this machine maps it) and what
    ``info.json`` says it was built from (``source``, ``what``, ``n``, ``size``, ``mode``, ``format``).
    """
    roots: list[tuple[str, Path]] = [("disk", Path(os.path.expanduser(cache_dir or default_cache_dir())))]
    shm = shm_root() if memory else None
    if shm is not None:
        roots.append(("memory", shm))
    out: list[dict[str, Any]] = []
    for kind, root in roots:
        if not root.is_dir():
            continue
        for folder in sorted(root.iterdir()):
            if not folder.is_dir():
                continue
            info: dict[str, Any] = {}
            with contextlib.suppress(OSError, ValueError):
                info = json.loads((folder / "info.json").read_text())
            entry = {
                "kind": kind,
                "in_use": in_use(folder),
                "key": folder.name,
                "path": str(folder),
                "bytes": _size_of(folder),
                "last_used": _last_used(folder),
                "complete": bool(info.get("complete")) and ".partial-" not in folder.name,
            }
            entry.update({k: info.get(k) for k in ("source", "what", "n", "size", "mode", "format")})
            out.append(entry)
    return out


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def _age(t: float) -> str:
    s = max(0.0, time.time() - t)
    if s < 3600:
        return f"{s / 60:.0f} min ago"
    if s < 86400 * 2:
        return f"{s / 3600:.0f} h ago"
    return f"{s / 86400:.0f} days ago"


def stores_summary(cache_dir: str | None = None, limit: int = 5) -> str:
    """A short text naming the largest disk stores in ``cache_dir`` and how to remove them ('' when none)."""
    stores = [s for s in list_stores(cache_dir, memory=False)]
    if not stores:
        return ""
    stores.sort(key=lambda s: -s["bytes"])
    total = sum(s["bytes"] for s in stores)
    shown = ", ".join(f"{s['key']} ({_human(s['bytes'])}, {s.get('source') or '?'}, used {_age(s['last_used'])})" for s in stores[:limit])
    more = f" and {len(stores) - limit} more" if len(stores) > limit else ""
    where = cache_dir or default_cache_dir()
    return (
        f"{len(stores)} store(s) there take {_human(total)}: {shown}{more}; see them with `cloc-lightning cache list "
        f"--cache_dir {where}` and remove old ones with `cloc-lightning cache remove --older-than DAYS --cache_dir {where}`"
    )


def remove_stores(
    cache_dir: str | None = None, keys: list[str] | None = None, older_than_days: float | None = None, everything: bool = False
) -> list[dict[str, Any]]:
    """Remove the stores named by ``keys``, or last used more than ``older_than_days`` ago, or all (``everything``).

    Memory stores that a live process maps are never removed.  Returns the stores removed.
    """
    if not keys and older_than_days is None and not everything:
        raise ValueError("say which stores to remove: their keys, --older-than DAYS or --all")
    if older_than_days is not None and not (older_than_days >= 0 and math.isfinite(older_than_days)):
        raise ValueError(f"--older-than must be a number of days >= 0, got {older_than_days}")
    wanted = set(keys or [])
    stores = list_stores(cache_dir)
    unknown = wanted - {s["key"] for s in stores}
    if unknown:
        raise ValueError(
            f"no store {sorted(unknown)} in {cache_dir or default_cache_dir()!r} or {shm_root()}; `cloc-lightning cache list` shows them"
        )
    cutoff = None if older_than_days is None else time.time() - 86400 * older_than_days
    removed = []
    for s in stores:
        chosen = everything or s["key"] in wanted or (cutoff is not None and s["last_used"] < cutoff)
        if not chosen or s["in_use"]:
            continue
        shutil.rmtree(s["path"], ignore_errors=True)
        removed.append(s)
    for root in {Path(s["path"]).parent for s in stores}:  # the build locks of stores no longer there
        for lock in root.glob("*.lock"):
            if not (root / lock.stem).exists():
                with contextlib.suppress(OSError):
                    lock.unlink()
    return removed


def cache_main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """``cloc-lightning cache list|remove``: see the decode-once stores (size, source, last use) and remove old ones."""
    parser = argparse.ArgumentParser(
        prog="cloc-lightning cache",
        description="See and remove the decode-once image stores of data.cache (disk: data.cache_dir; memory: /dev/shm).",
    )
    sub = parser.add_subparsers(dest="action", required=True)
    for name, text in (("list", "list the stores: key, kind, size, last use, what each was built from"), ("remove", "remove stores")):
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument(
            "--cache_dir", default=None, help="the disk stores' folder (default: $CLOC_CACHE_DIR or ~/.cache/cloc_lightning/images)"
        )
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")
        if name == "remove":
            p.add_argument("keys", nargs="*", help="keys of the stores to remove (from `cloc-lightning cache list`)")
            p.add_argument(
                "--older-than",
                dest="older_than",
                type=float,
                default=None,
                metavar="DAYS",
                help="remove stores last used more than DAYS ago",
            )
            p.add_argument("--all", dest="everything", action="store_true", help="remove every store not in use")
    args = parser.parse_args(argv)
    if args.cache_dir is not None and not os.path.isdir(os.path.expanduser(args.cache_dir)):
        what = "is a file" if os.path.exists(os.path.expanduser(args.cache_dir)) else "does not exist"
        raise ValueError(f"--cache_dir {args.cache_dir}: {what}; give the folder a run's data.cache_dir named (no stores are there)")
    if args.action == "list":
        stores = list_stores(args.cache_dir)
    else:
        stores = remove_stores(args.cache_dir, args.keys, args.older_than, args.everything)
    if args.json:
        print_line(None, json.dumps(stores, indent=1))
        return stores
    verb = "removed" if args.action == "remove" else "found"
    print_line(
        None,
        f"{len(stores)} store(s) {verb}, {_human(sum(s['bytes'] for s in stores))} in all (disk: {args.cache_dir or default_cache_dir()}; memory: {shm_root()})",
    )
    for s in stores:
        state = "" if s["complete"] else " (incomplete)"
        use = " in use" if s["in_use"] else ""
        shape = f"{s.get('n')} images at {s.get('size')} px ({s.get('mode')})" if s.get("n") is not None else "?"
        print_line(
            None,
            f"  {s['kind']:6} {s['key']}  {_human(s['bytes']):>9}  used {_age(s['last_used'])}{use}{state}  {shape}  from {s.get('source') or '?'}",
        )
    return stores
