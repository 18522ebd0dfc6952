"""Each constructor argument declared once: a method states only its own arguments and the defaults it changes.

A method's ``__init__`` declares its own arguments and takes its bases' (backbone, optimiser,
schedule, online probe, ...) through ``**kwargs``.  :func:`method_defaults` on the class gives
that constructor the complete signature -- its own arguments, then those of the components it
builds (``*arguments_of``), then its bases' -- with the defaults the method changes::

    @method_defaults(optimizer="sgd", lr=0.05, weight_decay=1e-4)
    class SupConModule(PretrainModule):
        def __init__(self, method: Method = "supcon", n_views: int = 2, **kwargs: Any) -> None:
            ...
            super().__init__(**kwargs)

Then ``SupConModule()`` trains with SGD at lr 0.05, and ``inspect.signature(SupConModule)``,
LightningCLI's ``--model.help`` / ``--print_config`` and its YAML validation show every argument
with the method's default.  The class docstring's ``Args`` section gains the description of
each argument it does not document itself, taken from the component or base that declares it,
so that ``--help`` describes every option (older jsonargparse versions, which the package
allows, read only the class's own docstring, not its bases').

The constructor binds its arguments to that signature (a wrong name is a ``TypeError`` naming
the class) and calls the method's ``__init__`` with all of them by keyword.  Hyper-parameters:
LightningCLI (Lightning >= 2.3) hands the module its configuration for ``save_hyperparameters``
through Lightning's context variable ``hparams_mixin._given_hyperparameters``; outside the CLI
the decorated constructor hands over its bound arguments the same way (with those of an
undecorated subclass that calls it through ``super().__init__``), because Lightning's own
collection reads each ``__init__`` frame's local variables by the names of its signature and
would find none for the arguments that arrive in ``**kwargs``.
"""

from __future__ import annotations

import functools
import inspect
import re
import typing
from collections.abc import Callable
from contextvars import ContextVar
from types import FrameType
from typing import Any, TypeVar

from lightning.pytorch.core.mixins.hparams_mixin import _given_hyperparameters

__all__ = ["method_defaults", "take_arguments"]

_C = TypeVar("_C", bound=type)

#: classes from these packages end the walk up the constructor chain (their arguments are no method options)
_FOREIGN = ("lightning", "pytorch_lightning", "torch", "builtins")
#: a Google-style ``Args:`` entry: ``name: text`` (also ``name (type): text`` and ``**kwargs: text``)
_ENTRY = re.compile(r"(\*{0,2}[A-Za-z_]\w*)(?:\s*\([^)]*\))?:(?:\s|$)")
_ARGS = ("Args:", "Arguments:")
#: where a method describes, in its own terms, arguments that arrive in its ``**kwargs`` (API docs: "Other parameters")
_KEYWORD_ARGS = ("Keyword Args:", "Keyword Arguments:")
#: the module whose hyper-parameters a decorated constructor handed to Lightning (``None``: none, or LightningCLI's)
_HPARAMS_OF: ContextVar[Any] = ContextVar("cloc_lightning_hparams_of", default=None)


def _parameters(function: Callable[..., Any]) -> tuple[list[inspect.Parameter], bool]:
    """``(parameters after self, with evaluated annotations; whether it takes **kwargs)`` of a constructor."""
    params = list(inspect.signature(function).parameters.values())[1:]
    hints: dict[str, Any] | None = None
    resolved = []
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if isinstance(p.annotation, str):  # postponed (``from __future__ import annotations``): the real type
            if hints is None:
                hints = typing.get_type_hints(function)
            p = p.replace(annotation=hints.get(p.name, p.annotation))
        resolved.append(p)
    return resolved, any(p.kind is p.VAR_KEYWORD for p in params)


def _bases_parameters(cls: type) -> list[inspect.Parameter]:
    """The arguments that ``cls.__init__``'s ``**kwargs`` reaches: the constructors up the MRO, to the first without ``**kwargs``."""
    found: dict[str, inspect.Parameter] = {}
    for base in cls.__mro__[1:]:
        if base.__module__.split(".")[0] in _FOREIGN:
            break
        init = base.__dict__.get("__init__")
        if init is None:
            continue
        params, more = _parameters(init)
        for p in params:
            found.setdefault(p.name, p)
        if not more:
            break
    return list(found.values())


def take_arguments(component: type, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Remove ``component``'s constructor arguments from ``kwargs`` and return them (for ``component(**taken)``)."""
    params, _ = _parameters(component.__init__)  # type: ignore[misc]  # reading a class's constructor
    return {p.name: kwargs.pop(p.name) for p in params if p.name in kwargs}


# ---------------------------------------------------------------------- docstrings
def _section(lines: list[str], titles: tuple[str, ...]) -> tuple[int, int, int] | None:
    """``(index of the title line, end of its entries (exclusive), the entries' indent)`` of a section, or ``None``."""
    for start, line in enumerate(lines):
        if line.strip() not in titles:
            continue
        indent = len(line) - len(line.lstrip())
        end, entry_indent = start + 1, None
        for i in range(start + 1, len(lines)):
            text = lines[i]
            if not text.strip():
                continue
            depth = len(text) - len(text.lstrip())
            if depth <= indent:
                break
            entry_indent = depth if entry_indent is None else entry_indent
            end = i + 1
        return start, end, (indent + 4 if entry_indent is None else entry_indent)
    return None


def _entries(lines: list[str], section: tuple[int, int, int] | None) -> dict[str, list[str]]:
    """``{name: the entry's lines}`` of a parameters section, dedented (``name: text`` first)."""
    if section is None:
        return {}
    start, end, indent = section
    entries: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in lines[start + 1 : end]:
        depth = len(line) - len(line.lstrip())
        match = _ENTRY.match(line.strip()) if depth == indent else None
        if match:
            current = entries.setdefault(match.group(1), [])
        if current is not None and line.strip():
            current.append(line[indent:])
    return entries


def _args_entries(doc: str | None) -> dict[str, list[str]]:
    """The entries of a docstring's ``Args`` and ``Keyword Args`` sections."""
    lines = inspect.cleandoc(doc or "").splitlines()
    return {**_entries(lines, _section(lines, _KEYWORD_ARGS)), **_entries(lines, _section(lines, _ARGS))}


def _documented(cls: type, params: list[inspect.Parameter], sources: list[type]) -> str:
    """``cls``'s docstring with one ``Args`` entry for every parameter in ``params``.

    An argument that arrives in ``**kwargs`` is described by the class's ``Keyword Args``
    section (moved into ``Args``) or else by the first of ``sources`` that describes it; the new
    entries go before a ``**kwargs`` entry (a new ``Args`` section at the end without one).
    """
    lines = inspect.cleandoc(cls.__doc__ or "").splitlines()
    keyword = _section(lines, _KEYWORD_ARGS)
    described = _entries(lines, keyword)
    if keyword is not None:
        start, end, _ = keyword
        blank_after = end < len(lines) and not lines[end].strip()
        del lines[start : end + (1 if blank_after else 0)]
    own = _entries(lines, _section(lines, _ARGS))
    added: list[str] = []
    for p in params:
        if p.name in own:
            continue
        entry = described.get(p.name) or next(
            (e for e in (_args_entries(s.__dict__.get("__doc__")).get(p.name) for s in sources) if e), None
        )
        added += entry or []
    section = _section(lines, _ARGS)
    if section is None:
        lines += ["", "Args:"]
        at, indent = len(lines), 4
    else:
        start, at, indent = section
        at = next((i for i in range(start + 1, at) if lines[i][indent:].startswith("**")), at)
    return "\n".join([*lines[:at], *(" " * indent + line for line in added), *lines[at:]])


# ---------------------------------------------------------------------- hyper-parameters
def _enclosing_arguments(obj: Any, frame: FrameType | None) -> dict[str, Any]:
    """The arguments of the ``__init__`` calls on ``obj`` that enclose ``frame`` (a subclass's constructor above the decorated one).

    Read from each frame's own parameters (its code), the outer ones overriding the inner, as
    Lightning's ``save_hyperparameters`` collects them.
    """
    collected: dict[str, Any] = {}
    while frame is not None and frame.f_code.co_name == "__init__":
        info = inspect.getargvalues(frame)
        if not info.args or info.locals.get(info.args[0]) is not obj:
            break
        collected.update({name: info.locals[name] for name in info.args[1:] if name in info.locals})
        if info.keywords:
            collected.update(info.locals.get(info.keywords) or {})
        frame = frame.f_back
    return collected


# ---------------------------------------------------------------------- the decorator
def method_defaults(*arguments_of: type, **defaults: Any) -> Callable[[_C], _C]:
    """Give a method's constructor its complete signature, with the defaults in ``defaults`` (see the module docstring).

    Args:
        *arguments_of: component classes whose constructor arguments the method takes as its
            own (it hands them over with :func:`take_arguments`), listed after its own.
        **defaults: the method's defaults of its bases' (or components') arguments, e.g.
            ``optimizer="sgd", lr=0.05``; a name the constructor chain does not take, or one the
            method declares itself (give that default in its signature), is a ``TypeError``.
    """

    def decorate(cls: _C) -> _C:
        init: Callable[..., None] | None = cls.__dict__.get("__init__")
        own, has_kwargs = _parameters(init) if init is not None else ([], False)
        if init is None or not has_kwargs:
            raise TypeError(f"@method_defaults: {cls.__name__} must define __init__(self, ..., **kwargs) (**kwargs: its bases' arguments)")
        names = {p.name for p in own}
        taken: dict[str, inspect.Parameter] = {}
        for params in [*(_parameters(c.__init__)[0] for c in arguments_of), _bases_parameters(cls)]:  # type: ignore[misc]
            for p in params:
                if p.name not in names and p.name not in taken:
                    taken[p.name] = p.replace(kind=inspect.Parameter.KEYWORD_ONLY, default=defaults.get(p.name, p.default))
        wrong = sorted(set(defaults) - set(taken))
        if wrong:
            declared = [n for n in wrong if n in names]
            raise TypeError(
                f"@method_defaults on {cls.__name__}: {wrong} "
                + (f"are declared by {cls.__name__}.__init__ itself; give their defaults in its signature" if declared
                   else f"are no arguments of its bases; they take {sorted(taken)}")
            )
        params = [*own, *taken.values()]
        self_param = next(iter(inspect.signature(init).parameters.values()))
        signature = inspect.Signature([self_param, *params], return_annotation=None)
        original = init

        @functools.wraps(original)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            try:
                bound = signature.bind(self, *args, **kwargs)
            except TypeError as e:
                raise TypeError(f"{type(self).__name__}: {e}") from None
            bound.apply_defaults()
            arguments = dict(bound.arguments)
            del arguments[self_param.name]
            owner = _HPARAMS_OF.get()
            if _given_hyperparameters.get() is not None and (owner is None or owner is self):
                original(self, **arguments)  # LightningCLI's configuration, or this module's own from a subclass's call
                return
            frame = inspect.currentframe()
            given = {**arguments, **_enclosing_arguments(self, frame.f_back if frame is not None else None)}
            del frame
            tokens = _given_hyperparameters.set(given), _HPARAMS_OF.set(self)
            try:
                original(self, **arguments)
            finally:
                _given_hyperparameters.reset(tokens[0])
                _HPARAMS_OF.reset(tokens[1])

        __init__.__signature__ = signature  # type: ignore[attr-defined]
        __init__.__annotations__ = {
            **{p.name: p.annotation for p in params if p.annotation is not inspect.Parameter.empty}, "return": None
        }
        cls.__init__ = __init__  # type: ignore[misc]  # (the class object itself: its constructor from now on)
        sources = [*arguments_of, *(b for b in cls.__mro__[1:] if b.__module__.split(".")[0] not in _FOREIGN)]
        cls.__doc__ = _documented(cls, params, sources)
        return cls

    return decorate
