"""UTKFace age estimation as an ordinal task.

UTKFace (Zhang, Song, Qi, CVPR 2017) names every aligned-and-cropped face
``<age>_<gender>_<race>_<datetime>.jpg.chip.jpg``; the age is the label.  This
module reads such a folder (the full "Aligned&Cropped Faces" download or any
subset), maps ages to ordinal classes by bin edges or to raw age ranks, and
splits deterministically by a hash of the file name.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from lightning.pytorch.utilities import rank_zero_warn

from cloc_lightning.data.base import BaseDataModule
from cloc_lightning.data.datasets import IMAGE_EXTENSIONS, ImageFileDataset, LabelledDataset
from cloc_lightning.data.errors import DataConfigError, check_root_for_stage, check_split_fractions, config_errors
from cloc_lightning.data.overlap import overlap_message, shared_with_training
from cloc_lightning.data.tables import hash_split
from cloc_lightning.validation import check_choice, check_int

__all__ = ["UTKFaceDataModule", "parse_utkface_name", "DEFAULT_AGE_BINS", "UTKFACE_AGES", "LabelMode"]

#: labels: the age group (``age_bins``) or the age in years itself
LabelMode = Literal["bins", "age"]

#: Lower edges of the default age groups: 0-3, 4-7, 8-14, 15-24, 25-37, 38-47, 48-59, 60+
#: (the eight Adience groups 0-2, 4-6, 8-13, 15-20, 25-32, 38-43, 48-53, 60+ with their gaps closed).
DEFAULT_AGE_BINS: tuple[int, ...] = (0, 4, 8, 15, 25, 38, 48, 60)

#: the ages UTKFace holds (1 to 116 years): a name with another age is a renamed or foreign file (``age_range``)
UTKFACE_AGES: tuple[int, int] = (1, 116)

_NAME = re.compile(r"^(?P<age>\d{1,3})_(?P<gender>\d)?_?(?P<race>\d)?_?(?P<date>\d+)?")


def parse_utkface_name(name: str) -> dict[str, int | None] | None:
    """Parse a UTKFace file name; ``None`` if it does not start with ``<age>_``.

    Returns ``{'age', 'gender', 'race'}`` (gender/race ``None`` when missing, as
    in a few files of the official release).
    """
    m = _NAME.match(os.path.basename(name))
    if m is None:
        return None
    g, r = m.group("gender"), m.group("race")
    return {"age": int(m.group("age")), "gender": int(g) if g else None, "race": int(r) if r else None}


def _list_images(root: str) -> list[str]:
    path = Path(os.path.expanduser(root))
    if not path.exists():
        raise DataConfigError(
            f"UTKFace root {str(path)!r} does not exist. Point data.root at a folder of UTKFace images "
            "(<age>_<gender>_<race>_<datetime>.jpg.chip.jpg), e.g. the 'Aligned&Cropped Faces' download."
        )
    if not path.is_dir():
        raise DataConfigError(f"UTKFace root {str(path)!r} is not a directory")
    files = sorted(str(p) for p in path.rglob("*") if p.is_file() and p.name.lower().endswith(IMAGE_EXTENSIONS))
    if not files:
        raise DataConfigError(f"UTKFace root {str(path)!r} contains no image files ({', '.join(IMAGE_EXTENSIONS[:3])}, ...)")
    return files


class UTKFaceDataModule(BaseDataModule):
    """UTKFace faces with ages as ordinal labels.

    Args:
        root: folder of UTKFace images (searched recursively), split into train/val/test;
            ``None`` for ``test`` / ``predict`` alone on ``test_root`` / ``predict_root``
            (a folder of one's own, where the training data may not be: then nothing is
            compared with the training split).
        label_mode: ``'bins'`` maps ages to groups by ``age_bins``; ``'age'`` uses
            raw ages clipped to ``[min_age, max_age]`` as ranks ``age - min_age`` (a
            warning at setup counts the clipped ages of each split).
        age_bins: sorted lower edges of the age groups, starting at 0; default
            :data:`DEFAULT_AGE_BINS` (8 groups).
        min_age: lowest age (rank 0) for ``label_mode='age'``.
        max_age: highest age (the last rank) for ``label_mode='age'``.
        split_fractions: ``(train, val, test)`` fractions of the hash split.
        split_salt: change to draw a different (still deterministic) split.
        test_root: evaluate on another folder of UTKFace files; ``root`` is then
            split into train/val only.  Files it shares with the training split (the
            same name, or the same bytes under another name) are counted in a warning.
        strict_names: image files whose names do not parse, or whose age lies outside
            ``age_range``, raise an error listing them (default); ``False`` skips them
            with a warning that counts them.
        age_range: ``(lowest, highest)`` age a file name may carry (default
            :data:`UTKFACE_AGES`, 1..116); widen it for a data set of your own whose
            ages are real.  Without it an age such as 250 or 0 would silently fall into
            an end class (``60+``, ``0-3``).
        **kwargs: :class:`BaseDataModule` arguments (``image_size`` default 64).
    """

    task = "ordinal"

    def __init__(
        self,
        root: str | None = None,
        label_mode: LabelMode = "bins",
        age_bins: Sequence[int] = DEFAULT_AGE_BINS,
        min_age: int = 1,
        max_age: int = 80,
        split_fractions: tuple[float, float, float] = (0.7, 0.1, 0.2),
        split_salt: str = "",
        test_root: str | None = None,
        strict_names: bool = True,
        age_range: tuple[int, int] = UTKFACE_AGES,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("image_size", 64)
        super().__init__(**kwargs)
        bins = [int(b) for b in age_bins]
        with config_errors():
            check_choice("label_mode", label_mode, LabelMode)
        if label_mode == "bins" and (len(bins) < 2 or bins[0] != 0 or any(b <= a for a, b in itertools.pairwise(bins))):
            raise DataConfigError(f"age_bins must be strictly increasing lower edges starting at 0 (>= 2 groups), got {bins}")
        if label_mode == "age" and not 0 <= min_age < max_age:
            raise DataConfigError(f"need 0 <= min_age < max_age, got {min_age}, {max_age}")
        with config_errors():
            if len(age_range) != 2:
                raise ValueError(f"age_range must be (lowest, highest), got {list(age_range)}")
            lo = check_int("age_range[0]", age_range[0], 0, hint="the lowest age a file name may carry, e.g. 1")
            hi = check_int("age_range[1]", age_range[1], lo, hint="the highest age a file name may carry, e.g. 116")
        if len(split_fractions) != 3:
            raise DataConfigError(f"split_fractions must be (train, val, test), got {split_fractions}")
        self.root = root
        self.label_mode = label_mode
        self.age_bins = bins
        self.min_age = min_age
        self.max_age = max_age
        self.split_fractions = check_split_fractions(split_fractions)
        self.split_salt = split_salt
        self.test_root = test_root
        self.strict_names = strict_names
        self.age_range = (lo, hi)

    def age_to_label(self, age: int) -> int:
        """Ordinal class of an age."""
        if self.label_mode == "age":
            return min(max(age, self.min_age), self.max_age) - self.min_age
        return sum(1 for b in self.age_bins if age >= b) - 1

    def discover_class_names(self) -> list[str]:
        if self.label_mode == "age":
            return [str(a) for a in range(self.min_age, self.max_age + 1)]
        edges = self.age_bins
        return [*(f"{a}-{b - 1}" for a, b in itertools.pairwise(edges)), f"{edges[-1]}+"]

    def _read_ages(self, root: str) -> tuple[list[str], list[int]]:
        """The parseable image files under ``root`` and their ages."""
        files, labels, bad = [], [], []
        for f in _list_images(root):
            parsed = parse_utkface_name(f)
            if parsed is None:
                bad.append(os.path.basename(f))
                continue
            files.append(f)
            labels.append(int(parsed["age"]))  # type: ignore[arg-type]
        if bad and self.strict_names:
            raise DataConfigError(
                f"{len(bad)} file(s) in {root!r} do not follow UTKFace naming <age>_<gender>_<race>_<datetime>.jpg, "
                f"e.g. {bad[:5]}. Rename or remove them, or set data.strict_names: false to skip them."
            )
        if bad:
            rank_zero_warn(f"skipped {len(bad)} UTKFace file(s) whose names do not parse, e.g. {bad[:3]}")
        files, labels = self._within_age_range(root, files, labels)
        if not files:
            raise DataConfigError(f"no UTKFace images with parseable names in {root!r}")
        return files, labels

    def _within_age_range(self, root: str, files: list[str], ages: list[int]) -> tuple[list[str], list[int]]:
        """``files``/``ages`` whose age lies in ``age_range``; the others are refused (``strict_names``) or skipped, counted.

        Binning never clips (the last group is open-ended), so without this check a renamed or
        foreign file (``250_...``, ``0_...``) would land in ``60+`` or ``0-3`` without a trace.
        """
        lo, hi = self.age_range
        out = [i for i, a in enumerate(ages) if not lo <= a <= hi]
        if not out:
            return files, ages
        names = [os.path.basename(files[i]) for i in out]
        found = sorted({ages[i] for i in out})
        shown = ", ".join(str(a) for a in found[:8]) + (", ..." if len(found) > 8 else "")
        if self.strict_names:
            raise DataConfigError(
                f"{len(out)} UTKFace file(s) in {root!r} have ages outside {lo}..{hi} (ages {shown}), e.g. {names[:5]}; "
                "rename or remove them, widen data.age_range if those ages are real, or set data.strict_names: false "
                "to skip them (they would otherwise fall silently into an end class)"
            )
        rank_zero_warn(
            f"skipped {len(out)} UTKFace file(s) with ages outside {lo}..{hi} (ages {shown}) in {root!r}, "
            f"e.g. {names[:3]}; widen data.age_range if those ages are real",
        )
        keep = set(range(len(files))) - set(out)
        return [f for i, f in enumerate(files) if i in keep], [a for i, a in enumerate(ages) if i in keep]

    def setup(self, stage: str | None = None) -> None:
        """As :meth:`BaseDataModule.setup`; without ``root`` only ``test`` (and ``predict``) can run, on ``test_root``."""
        if self.root is None:
            layout = "a folder of UTKFace images (<age>_<gender>_<race>_<datetime>.jpg.chip.jpg)"
            without = "data.test_root (test) / data.predict_root (predict)"
            alone = self.predict_root is not None
            check_root_for_stage(type(self).__name__, stage, self.test_root, layout, predict_alone=alone, without_root=without)
        super().setup(stage)

    def build_predict_set(self) -> LabelledDataset:
        """``predict_root`` as the base class reads it; a folder whose every image has a UTKFace name gets its ages as targets.

        A folder with some names that do not parse (or ages outside ``age_range``) is predicted
        without targets, and a warning says how many names were not read.
        """
        ds = super().build_predict_set()
        assert self.predict_root is not None
        if not isinstance(ds, ImageFileDataset) or ds.labelled or os.path.splitext(self.predict_root)[1].lower() == ".csv":
            return ds
        ages = [parse_utkface_name(f) for f in ds.files]
        lo, hi = self.age_range
        readable = [p is not None and lo <= int(p["age"] or 0) <= hi for p in ages]
        if all(readable):
            self.class_names = self.class_names or self.discover_class_names()
            labels = [self.age_to_label(int(p["age"] or 0)) for p in ages if p is not None]
            return ImageFileDataset(ds.files, labels, "raise")
        if any(readable):
            bad = [os.path.basename(f) for f, ok in zip(ds.files, readable, strict=True) if not ok]
            rank_zero_warn(
                f"predict_root {self.predict_root!r}: {len(bad)} of {len(ds.files)} image(s) have no UTKFace name with an "
                f"age in {lo}..{hi} (e.g. {bad[:3]}), so predictions.csv has no target column; rename them "
                "(<age>_<gender>_<race>_<datetime>.jpg) to get targets",
            )
        return ds

    def build_base_sets(self) -> dict[str, LabelledDataset]:
        self.class_names = self.discover_class_names()
        if self.root is None:  # test alone on test_root (setup refuses every other stage)
            assert self.test_root is not None
            test = self._read_ages(self.test_root)
            self._warn_clipped({"train": ([], []), "val": ([], []), "test": test})
            empty = ImageFileDataset([], [], self.bad_files)
            labels = [self.age_to_label(a) for a in test[1]]
            return {
                "train": empty,
                "val": ImageFileDataset([], [], self.bad_files),
                "test": ImageFileDataset(test[0], labels, self.bad_files),
            }
        files, ages = self._read_ages(self.root)
        keys = [os.path.basename(f) for f in files]
        split_ages: dict[str, tuple[list[str], list[int]]] = {}
        if self.test_root is None:
            split = hash_split(keys, self.split_fractions, self.split_salt)
            names: tuple[str, ...] = ("train", "val", "test")
        else:
            split = hash_split(keys, self.split_fractions[:2], self.split_salt)
            names = ("train", "val")
            split_ages["test"] = self._read_ages(self.test_root)
        for i, name in enumerate(names):
            split_ages[name] = (
                [f for f, s in zip(files, split, strict=True) if s == i],
                [a for a, s in zip(ages, split, strict=True) if s == i],
            )
        if self.test_root is not None:
            overlap = shared_with_training(split_ages["train"][0], split_ages["test"][0])
            if overlap:
                # once per job, not once per process (every rank sets up the same data)
                rank_zero_warn(overlap_message(overlap, len(split_ages["test"][0]), self.test_root, self.root))
        self._warn_clipped(split_ages)
        return {
            name: ImageFileDataset(split_ages[name][0], [self.age_to_label(a) for a in split_ages[name][1]], self.bad_files)
            for name in ("train", "val", "test")
        }

    def _warn_clipped(self, split_ages: dict[str, tuple[list[str], list[int]]]) -> None:
        """One warning with the count and range, per split, of the ages ``label_mode: age`` clips into its end classes.

        A warning, not an error: top-coding (every age above ``max_age`` in the last class) is
        the documented meaning of ``max_age`` and common practice for UTKFace's few very old
        faces (ages up to 116); the count lets the user see how many samples it moves.
        Age bins never clip (their last group is open-ended).
        """
        if self.label_mode != "age":
            return
        parts = []
        for name in ("train", "val", "test"):
            ages = split_ages[name][1]
            above = [a for a in ages if a > self.max_age]
            below = [a for a in ages if a < self.min_age]
            counts = []
            for out, side, bound in ((above, "above", self.max_age), (below, "below", self.min_age)):
                if out:
                    lo, hi = min(out), max(out)
                    counts.append(f"{len(out)} {side} {bound} ({f'age {lo}' if lo == hi else f'ages {lo}-{hi}'})")
            if counts:
                parts.append(f"{name}: {', '.join(counts)} of {len(ages)}")
        if parts:
            rank_zero_warn(
                f"UTKFace label_mode 'age' clips ages outside [{self.min_age}, {self.max_age}] into the end classes "
                f"('{self.min_age}' and '{self.max_age}'): {'; '.join(parts)}. Set data.min_age / data.max_age to "
                "cover them, or use label_mode: bins (open-ended last group) if that is not intended",
            )
