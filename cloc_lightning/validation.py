"""Argument checks shared by every layer (losses, networks, data, methods, metrics).

One place for the checks so that every bad value gets the same kind of message: what
the argument must be, what it got, and (``hint``) how to fix it.  Type problems raise
:class:`TypeError`, bad values :class:`ValueError`; data-module code wraps them in its
own :class:`~cloc_lightning.data.errors.DataConfigError` where it needs to.

Choices are derived once from the ``Literal`` types the signatures already carry, so a
new option is added in one place (the type) and both LightningCLI and the checks see it::

    Reduction = Literal["official", "mean"]
    check_choice("reduction", reduction, Reduction)   # "reduction must be 'official' or 'mean', got 'x'"

Where a check's own wording does not fit (a requirement such as "a positive float"
that users already know from the message), ``expect`` replaces the "what it must be"
part; the rest of the message stays the same.
"""

from __future__ import annotations

import inspect
import math
import numbers
import os
import typing
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["choices", "check_choice", "check_int", "check_float", "check_tensor", "check_bool", "invalid_yaml", "check_keywords"]
__all__ += ["read_text", "write_problem"]


def choices(literal_type: Any) -> tuple[Any, ...]:
    """The values a ``Literal[...]`` type allows (also inside ``Optional`` / ``Union`` of literals)."""
    origin = typing.get_origin(literal_type)
    if origin is typing.Literal:
        return tuple(typing.get_args(literal_type))
    if origin is typing.Union or (origin is not None and str(origin) == "<class 'types.UnionType'>"):
        out: list[Any] = []
        for arg in typing.get_args(literal_type):
            if arg is type(None):
                continue
            out.extend(v for v in choices(arg) if v not in out)
        return tuple(out)
    raise TypeError(f"{literal_type!r} is not a Literal type")


def _suffix(hint: str) -> str:
    return f"; {hint}" if hint else ""


def _either(options: tuple[Any, ...]) -> str:
    """``'a'``, ``'a' or 'b'``, ``'a', 'b' or 'c'`` (values as written in Python/YAML)."""
    shown = [repr(o) for o in options]
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} or {shown[-1]}"


def check_choice(name: str, value: Any, allowed: Any, *, hint: str = "") -> Any:
    """``value`` if it is one of ``allowed`` (a ``Literal`` type or a sequence), else ``ValueError``
    (``"<name> must be 'a' or 'b', got 'c'"``)."""
    options = choices(allowed) if not isinstance(allowed, (tuple, list, set, frozenset)) else tuple(allowed)
    if value not in options:
        raise ValueError(f"{name} must be {_either(options)}, got {value!r}{_suffix(hint)}")
    return value


def check_int(name: str, value: Any, minimum: int | None = None, *, maximum: int | None = None, hint: str = "", expect: str = "") -> int:
    """``int(value)`` for an integer (``bool`` is refused; a one-element integer tensor is taken) in
    ``[minimum, maximum]``; ``expect`` replaces the "must be ..." wording of every message."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and _is_integer_dtype(value.dtype):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be {expect or 'an int'}, got {value!r} ({type(value).__name__}){_suffix(hint)}")
    number = int(value)
    if minimum is not None and number < minimum:
        raise ValueError(f"{name} must be {expect or f'>= {minimum}'}, got {number}{_suffix(hint)}")
    if maximum is not None and number > maximum:
        raise ValueError(f"{name} must be {expect or f'<= {maximum}'}, got {number}{_suffix(hint)}")
    return number


def _is_integer_dtype(dtype: torch.dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def check_float(
    name: str,
    value: Any,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    strict_minimum: bool = False,
    strict_maximum: bool = False,
    allow_inf: bool = False,
    hint: str = "",
    expect: str = "",
) -> float:
    """``float(value)`` for a real number (``bool`` is refused, a one-element float tensor is taken).

    ``minimum``/``maximum`` bound it (``strict_*``: exclusive); NaN is always refused and
    infinity unless ``allow_inf``.  ``expect`` replaces the "must be ..." wording of every
    message (e.g. ``"a positive float (e.g. 0.07)"``).
    """
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.is_floating_point():
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        quoted = " (a quoted string in YAML? write the number without quotes)" if isinstance(value, str) and _is_number(value) else ""
        raise TypeError(f"{name} must be {expect or 'a number'}, got {value!r} ({type(value).__name__}){quoted}{_suffix(hint)}")
    number = float(value)
    if math.isnan(number) or (math.isinf(number) and not allow_inf):
        raise ValueError(f"{name} must be {expect or 'a finite number'}, got {number!r}{_suffix(hint)}")
    if minimum is not None and (number <= minimum if strict_minimum else number < minimum):
        bound = f"{'>' if strict_minimum else '>='} {minimum}"
        raise ValueError(f"{name} must be {expect or bound}, got {number!r}{_suffix(hint)}")
    if maximum is not None and (number >= maximum if strict_maximum else number > maximum):
        bound = f"{'<' if strict_maximum else '<='} {maximum}"
        raise ValueError(f"{name} must be {expect or bound}, got {number!r}{_suffix(hint)}")
    return number


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def check_tensor(
    name: str,
    value: Any,
    *,
    dim: int | tuple[int, ...] | None = None,
    floating: bool | None = None,
    non_empty: bool = False,
    hint: str = "",
    layout: str = "",
    holding: str = "",
) -> torch.Tensor:
    """``value`` if it is a tensor with ``dim`` dimensions (one of them), floating point or
    integer as ``floating`` asks, and (``non_empty``) at least one element.

    ``layout`` names the expected shape in the messages (``"[batch, dim]"``: "prediction must
    be 2-D [batch, dim], got shape (3,)"), ``holding`` what integer entries are
    (``"class ids"``: "target must hold integer class ids, got dtype torch.float32").
    """
    shape = f" {layout}" if layout else ""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor{shape}, got {type(value).__name__}{_suffix(hint)}")
    if floating is True and not value.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {value.dtype}; cast with .float(){_suffix(hint)}")
    if floating is False and not _is_integer_dtype(value.dtype):
        what = f"integer {holding}" if holding else "integers"
        raise TypeError(f"{name} must hold {what}, got dtype {value.dtype}; cast with .long(){_suffix(hint)}")
    dims = (dim,) if isinstance(dim, int) else dim
    if dims is not None and value.dim() not in dims:
        want = " or ".join(f"{d}-D" for d in dims)
        raise ValueError(f"{name} must be {want}{shape}, got shape {tuple(value.shape)}{_suffix(hint)}")
    if non_empty and value.numel() == 0:
        raise ValueError(f"{name} must be non-empty{shape}, got shape {tuple(value.shape)}{_suffix(hint)}")
    return value


def check_bool(name: str, value: Any, *, hint: str = "") -> bool:
    """``value`` if it is ``True`` or ``False`` (not merely truthy: ``"no"`` is refused)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}{_suffix(hint)}")
    return value


def invalid_yaml(where: str, err: Exception) -> str:
    """``<where>:<line>:<column>: invalid YAML: <problem>`` for a YAML syntax error (PyYAML's ``MarkedYAMLError``).

    ``where`` is the file, or for a value given inline the option that held it (``--model``,
    ``learnable_map``); PyYAML itself calls such a text ``"<unicode string>"``.
    """
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or getattr(err, "context", None) or str(err).splitlines()[0]
    context, context_mark = getattr(err, "context", None), getattr(err, "context_mark", None)
    located = f"{where}:{mark.line + 1}:{mark.column + 1}" if mark is not None else where
    extra = f" ({context} at line {context_mark.line + 1})" if context and context_mark is not None and problem != context else ""
    return f"{located}: invalid YAML: {problem}{extra}"


def check_keywords(owner: object, init: Callable[..., Any], kwargs: dict[str, Any]) -> None:
    """Refuse a keyword in ``kwargs`` that the base constructor ``init`` does not take, naming ``owner``'s class.

    A method passes its bases' arguments on with ``**kwargs``; a mistyped name would otherwise
    surface as ``BaseModule.__init__() got an unexpected keyword argument``.  The bases that hand
    ``**kwargs`` to :class:`~cloc_lightning.methods.base.BaseModule` call this first
    (``check_keywords(self, super().__init__, kwargs)``), so the error names the class the user
    built.  Nothing is checked when ``init`` takes ``**kwargs`` itself.
    """
    params = inspect.signature(init).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    unknown = [name for name in kwargs if name not in params or params[name].kind is inspect.Parameter.POSITIONAL_ONLY]
    if unknown:
        raise TypeError(f"{type(owner).__name__}: got an unexpected keyword argument {unknown[0]!r}")


def read_text(path: str, what: str, fix: str) -> str:
    """The UTF-8 text of the file ``path``; a file that is not text is a ``ValueError`` naming ``what`` (the setting,
    e.g. ``"--model.learnable_map"``), the file, the first byte that is not UTF-8, and ``fix``."""
    with open(path, "rb") as f:
        raw = f.read()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        bad = e.start
    # raised outside the handler: the message is this one, not the codec's
    raise ValueError(f"{what} {path}: not a text file (byte {bad}: {raw[bad : bad + 1]!r} is not UTF-8); {fix}")


def write_problem(folder: str) -> str | None:
    """Create ``folder`` and write a file there; ``None`` when that works, else why not, as a phrase for a message:
    ``"<path> is a file, not a folder"`` (a path above it is a file) or the system's reason (``"Permission denied"``)."""
    existing = os.path.abspath(folder)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return f"{existing} is a file, not a folder"
    try:
        os.makedirs(folder, exist_ok=True)
        probe = os.path.join(folder, f".cloc-write-test-{os.getpid()}")
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as e:
        return str(e.strerror or e)
    return None
