"""Files an evaluation folder shares with the training split: by file name, and by content.

A test folder of one's own (``test_root``: a held-out set, a second site) that holds copies of
training images is no held-out result, whatever the copies are called.  :func:`shared_with_training`
finds them: the same base name, or the same bytes (only files of equal size are read and hashed,
so a folder of new images costs one ``stat`` per file); :func:`overlap_message` words the
warning the data modules give.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["Overlap", "shared_with_training", "overlap_message"]


@dataclass
class Overlap:
    """Test files shared with the training split: ``same_content`` / ``same_name`` as ``(test file, training file)`` pairs."""

    same_content: list[tuple[str, str]] = field(default_factory=list)
    same_name: list[tuple[str, str]] = field(default_factory=list)

    @property
    def test_files(self) -> set[str]:
        """The test files shared in either way."""
        return {t for t, _ in self.same_content} | {t for t, _ in self.same_name}

    def __bool__(self) -> bool:
        return bool(self.same_content or self.same_name)


def _digest(path: str) -> str:
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return -1


def shared_with_training(train: Sequence[str], test: Sequence[str]) -> Overlap:
    """The files of ``test`` that are files of ``train`` too: the same base name, or byte-identical contents."""
    found = Overlap()
    names = {os.path.basename(f): f for f in train}
    by_size: dict[int, list[str]] = {}
    for f in train:
        by_size.setdefault(_size(f), []).append(f)
    hashes: dict[str, str] = {}

    def digest(path: str) -> str | None:
        if path not in hashes:
            try:
                hashes[path] = _digest(path)
            except OSError:
                return None
        return hashes[path]

    for t in test:
        same = names.get(os.path.basename(t))
        if same is not None:
            found.same_name.append((t, same))
        size = _size(t)
        candidates = by_size.get(size, []) if size >= 0 else []
        if candidates:
            mine = digest(t)
            twin = next((c for c in candidates if mine is not None and digest(c) == mine), None)
            if twin is not None:
                found.same_content.append((t, twin))
    return found


def overlap_message(
    overlap: Overlap,
    n_test: int,
    test_root: str,
    root: str,
    *,
    test_key: str = "test_root",
    root_key: str = "data.root",
    fix: str = "folder",
) -> str:
    """One line: how many test images are training images (by content, by name), an example of each, and the fix."""
    parts = []
    if overlap.same_content:
        t, s = overlap.same_content[0]
        parts.append(
            f"{len(overlap.same_content)} byte-identical to a training image (e.g. {os.path.basename(t)!r} = {os.path.basename(s)!r})"
        )
    if overlap.same_name:
        t, _ = overlap.same_name[0]
        parts.append(f"{len(overlap.same_name)} with a training file's name (e.g. {os.path.basename(t)!r})")
    return (
        f"{test_key} {test_root!r}: {len(overlap.test_files)} of {n_test} test image(s) are in the training split of "
        f"{root_key} {root!r}: {'; '.join(parts)}; their metrics are no held-out result: remove them from the test "
        f"{fix} (or from {root_key} and train again)"
    )
