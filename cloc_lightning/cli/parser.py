"""The ``cloc-lightning`` parser: plain-text help and one-line parse errors.

:class:`CLOCArgumentParser` (LightningCLI's parser with :class:`~cloc_lightning.cli.helptext.CLOCHelpFormatter`)
turns jsonargparse's nested messages into one ``error:`` line naming the key, the value and the fix
(:func:`short_parse_error`, with the nearest valid keys); the ``REQUIRED:`` placeholders of the phase-two
configs are refused here too (:func:`check_required_placeholders`).
"""

from __future__ import annotations

import argparse
import copy
import difflib
import re
import sys
from collections.abc import Iterable
from typing import Any, NoReturn

import yaml
from lightning.pytorch.cli import LightningArgumentParser

from cloc_lightning._logging import debug_requested
from cloc_lightning.checkpoints import import_class
from cloc_lightning.cli.helptext import CLOCHelpFormatter, rst_to_text
from cloc_lightning.validation import invalid_yaml, read_text

__all__ = [
    "CLOCArgumentParser",
    "CLOCCLIHelpFormatter",
    "REQUIRED_MARK",
    "required_placeholders",
    "check_required_placeholders",
    "check_config_files",
    "short_parse_error",
    "exit_with_parse_error",
    "yaml_parse_error",
]


# ---------------------------------------------------------------------------------------------- help text
def _summary(fn: Any) -> str:
    """The first sentence of ``fn``'s docstring (its first paragraph, joined, up to the first ``. ``)."""
    doc = (getattr(fn, "__doc__", None) or "").strip()
    paragraph = " ".join(line.strip() for line in doc.split("\n\n", 1)[0].splitlines())
    end = re.search(r"[.!?](\s|$)", paragraph)
    return rst_to_text(paragraph[: end.start() + 1] if end else paragraph)


# ---------------------------------------------------------------------------------------------- parser errors
#: LightningCLI's optimiser/scheduler options, which cloc-lightning does not offer (the module configures both)
_LIGHTNING_OPTIM_KEYS = ("optimizer", "lr_scheduler")


def _optimizer_keys_message(given: str) -> str:
    from typing import get_args

    from cloc_lightning.methods.optim import OptimizerName, SchedulerName

    return (
        f"{given}: cloc-lightning has no --optimizer/--lr_scheduler options (LightningCLI's would replace the module's "
        f"optimiser, its parameter groups such as the CLOC margins' and its schedule); set them on the model: "
        f"--model.optimizer {{{','.join(get_args(OptimizerName))}}} --model.lr --model.weight_decay --model.momentum, "
        f"schedule --model.scheduler {{{','.join(get_args(SchedulerName))}}} --model.warmup_epochs --model.min_lr_ratio "
        "--model.lr_milestones --model.lr_gamma --model.lr_interval"
    )


def _check_no_lightning_optimizer_keys(argv: list[str]) -> None:
    """Refuse ``--optimizer ...``/``--lr_scheduler ...`` and top-level ``optimizer:``/``lr_scheduler:`` in ``--config`` files."""
    for arg in argv:
        key = arg.split("=", 1)[0]
        if any(key == f"--{k}" or key.startswith(f"--{k}.") for k in _LIGHTNING_OPTIM_KEYS):
            raise ValueError(_optimizer_keys_message(key))
    for path in _config_paths(argv):
        try:
            with open(path) as f:
                data = yaml.safe_load(f)
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue  # the parser reports unreadable files
        if isinstance(data, dict):
            for k in _LIGHTNING_OPTIM_KEYS:
                if k in data:
                    raise ValueError(_optimizer_keys_message(f"{path}: top-level '{k}:'"))


def _config_paths(argv: list[str]) -> list[str]:
    """The values of ``--config X`` / ``-c X`` / ``--config=X`` on the command line."""
    out = []
    for i, arg in enumerate(argv):
        if arg in ("--config", "-c") and i + 1 < len(argv):
            out.append(argv[i + 1])
        elif arg.startswith("--config="):
            out.append(arg.split("=", 1)[1])
    return out


def check_config_files(argv: list[str]) -> None:
    """Refuse a ``--config`` file that is empty, binary or not UTF-8 text, naming the file and the fix (a ``ValueError``).

    (A missing file, a folder and invalid YAML are the parser's own one-line errors.)
    """
    example = "a config is a YAML mapping of trainer/model/data settings (`cloc-lightning configs copy cloc/demo` writes one)"
    for path in _config_paths(argv):
        if not path.strip():
            raise ValueError(f"--config {path!r}: no file named; {example}")
        try:
            text = read_text(path, "--config", example)
        except OSError:
            continue  # the parser names missing files and folders
        if not text.strip():
            raise ValueError(f"--config {path}: the file is empty; {example}")
        twice = _duplicate_key(text)
        if twice:
            raise ValueError(f"--config {path}:{twice}; the second would silently replace the first: merge them into one")
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError:
            continue  # the parser names the line and column
        if not isinstance(data, dict):
            kind = "only comments" if data is None else f"a YAML {'list' if isinstance(data, list) else type(data).__name__}"
            raise ValueError(f"--config {path}: the file holds {kind}, not a mapping of settings; {example}")


class _DuplicateKey(Exception):
    pass


class _UniqueKeyLoader(yaml.SafeLoader):  # type: ignore[misc]
    """A YAML loader that refuses a mapping holding one key twice (PyYAML keeps the last, silently)."""

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if isinstance(key, str) and key in seen:
                raise _DuplicateKey(f"{line}: key {key!r} given twice (first on line {seen[key]})")
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _duplicate_key(text: str) -> str | None:
    """``"<line>: key 'trainer' given twice (first on line 1)"`` for a YAML text holding a mapping key twice, else None
    (invalid YAML is left to the parser's own one-line error)."""
    try:
        yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass
    except _DuplicateKey as e:
        return str(e)
    except yaml.YAMLError:
        return None
    return None


def _option_names(parser: Any) -> list[str]:
    """Every ``--key`` of ``parser`` (and of its sub-command parsers)."""
    names: list[str] = []
    for action in getattr(parser, "_actions", []):
        names.extend(o for o in action.option_strings if o.startswith("--"))
        for sub in (getattr(action, "choices", None) or {}).values() if isinstance(getattr(action, "choices", None), dict) else ():
            names.extend(_option_names(sub))
    return names


def _class_option_names(class_path: str, prefix: str) -> list[str]:
    """``--<prefix>.<arg>`` for every init argument jsonargparse accepts for ``class_path``."""
    from jsonargparse import ArgumentParser

    cls = import_class(class_path)
    if cls is None:
        return []
    try:
        parser = ArgumentParser(exit_on_error=False)
        parser.add_class_arguments(cls, prefix)
    except Exception:  # noqa: BLE001  # only for a suggestion: whatever fails here must not hide the error itself
        return []
    return [o for o in _option_names(parser) if not o.endswith(".help")]


def _initials(name: str) -> str:
    return "".join(part[:1] for part in name.split("_") if part)


def _nearest(key: str, names: Iterable[str]) -> str:
    """``; did you mean --a or --b?`` for the valid keys nearest to ``key`` (spelling, or ``learning_rate`` ~ ``lr``)."""
    pool = sorted(set(names))
    prefix, _, last = key.rpartition(".")
    same_level = [n for n in pool if n.rpartition(".")[0] == prefix]
    leaf = {n: n.rpartition(".")[2] for n in same_level}
    abbreviated = [
        n for n in same_level if len(last) > 1 and last != leaf[n] and (_initials(last) == leaf[n] or _initials(leaf[n]) == last)
    ]
    close = difflib.get_close_matches(key, pool, n=3, cutoff=0.6)
    found = list(dict.fromkeys(abbreviated + close))[:3]
    return f"; did you mean {' or '.join(found)}?" if found else ""


def _yaml_error(paths: list[str]) -> str | None:
    """``<file>:<line>:<column>: invalid YAML: <problem>`` for the first ``--config`` file that is not valid YAML."""
    for path in paths:
        try:
            with open(path) as f:
                yaml.safe_load(f)
        except yaml.MarkedYAMLError as e:
            return invalid_yaml(path, e)
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
    return None


def _inline_values(argv: list[str]) -> list[tuple[str, str]]:
    """``(option, value)`` for each ``--key value`` / ``--key=value`` whose value is an inline YAML ``{...}`` or ``[...]``."""
    out = []
    for i, arg in enumerate(argv):
        if not arg.startswith("--"):
            continue
        key, eq, value = arg.partition("=")
        if not eq:
            if i + 1 >= len(argv):
                continue
            value = argv[i + 1]
        if key != "--config" and value.lstrip()[:1] in ("{", "["):
            out.append((key, value))
    return out


def _inline_yaml_error(argv: list[str], text: str) -> str | None:
    """``--key:<line>:<column>: invalid YAML: ...`` for an inline ``{...}``/``[...]`` value, of the key the parser refused.

    Only looked at after the parser failed: a ``str`` option takes any text (a checkpoint ``filename`` such as
    ``{epoch}-{step}`` is not YAML), so an inline value that is not YAML is an error only where the parser said so.
    """
    refused = set(re.findall(r'Parser key "([^"]+)"', text)) | set(re.findall(r"--([\w.]+)", text))
    if not refused:
        return None
    for key, value in _inline_values(argv):
        name = key[2:].replace(".init_args.", ".")
        if not any(
            name == r or name.startswith(r + ".") or r.startswith(name + ".") or r.replace(".init_args.", ".") == name for r in refused
        ):
            continue
        try:
            yaml.safe_load(value)
        except yaml.MarkedYAMLError as e:
            return invalid_yaml(key, e)
        except yaml.YAMLError:
            continue
    return None


def yaml_parse_error(message: str, argv: list[str]) -> str | None:
    """The ``file:line:col: invalid YAML`` line of a parse error caused by YAML syntax (a ``--config`` file or an inline value)."""
    text = " ".join(ln.strip() for ln in message.strip().splitlines() if ln.strip())
    if "Problems parsing config" in text and "<unicode string>" in text:
        found = _yaml_error(_config_paths(argv))
        if found:
            return found
    return _inline_yaml_error(argv, text)


def short_parse_error(message: str, parser: Any, argv: list[str]) -> str:
    """jsonargparse's (often nested, many-line) parse error as one line naming the key, the value and the fix."""
    lines = [ln.strip() for ln in message.strip().splitlines() if ln.strip()]
    text = " ".join(lines)
    found = yaml_parse_error(message, argv)
    if found:
        return found
    m = re.search(r'Parser key "([^"]+)":.*?Problem with given class_path \'([^\']+)\':\s*(.*?)(?:- Expected a|Given value type|$)', text)
    if m:
        key, class_path, inner = m.group(1), m.group(2), m.group(3).strip()
        cls_name = class_path.rsplit(".", 1)[-1]
        bad = re.search(r"Option '([^']+)' is not accepted", inner)
        if bad:
            opt = f"--{key}.{bad.group(1)}"
            return f"{opt}: {cls_name} has no such argument{_nearest(opt, _class_option_names(class_path, key))}"
        sub = re.search(r'Parser key "([^"]+)":\s*(.*)', inner)
        if sub:
            return f"--{key}.{sub.group(1)}: {_plain_type_error(sub.group(2))} ({cls_name})"
        unimportable = class_path_problem(key, class_path, inner)
        return unimportable or f"--{key} ({cls_name}): {inner}"
    m = re.search(r'Parser key "([^"]+)":.*?Expected a dot import path string: (\S+)', text)
    base = re.search(r"Subtypes: \[<class '([^']+)'>", text)
    if m and base:
        return unknown_class_name(m.group(1), m.group(2), base.group(1))
    m = re.search(r"Unrecognized arguments: (.*)", text, flags=re.IGNORECASE)
    if m:
        first = m.group(1).split()[0]
        key = first.split("=", 1)[0]
        return f"unknown option {key}{_nearest(key, _option_names(parser))}"
    m = re.search(r"the following arguments are required: (.*)", text)
    if m:
        names = [n.strip().split(".", 1)[-1] if n.strip().startswith(("fit.", "validate.", "test.", "predict.")) else n.strip()
                 for n in m.group(1).split(",")]  # fmt: skip
        options = " and ".join(f"--{n}" for n in names if n)
        verb = "is" if len(names) == 1 else "are"
        return f"{options} {verb} required; give {'it' if len(names) == 1 else 'them'} on the command line or in a --config file"
    m = re.search(r'Parser key "config": File does not exist: (.*)', text)
    if m:
        return f"--config: no such file: {m.group(1)} (`cloc-lightning configs list` names the shipped configs)"
    m = re.search(r"Subcommand '([^']+)' does not accept option '([^']+)'", text)
    if m:
        key = "--" + m.group(2)
        names = _option_names(parser)
        first, _, rest = m.group(2).partition(".")
        tops = sorted({n[2:].split(".", 1)[0] for n in names})
        near = difflib.get_close_matches(first, tops, n=1, cutoff=0.7) if first not in tops else []
        hint = f"; did you mean --{near[0]}{'.' + rest if rest else ''}?" if near else _nearest(key, names)
        return f"{key}: not a setting of {m.group(1)} (a --config key or an option){hint}"
    m = re.search(r"Key '([^']+)' is not expected", text)
    if m:
        key = "--" + m.group(1)
        return f"{lines[0]}{_nearest(key, _option_names(parser))}"
    m = re.search(r'Parser key "([^"]+)":\s*(.*)', text)
    if m and "Does not validate against any of the Union subtypes" not in m.group(2):
        return f"--{m.group(1)}: {_plain_type_error(m.group(2))}"
    if m:
        return _union_error(message, m.group(1))
    return lines[0] if lines else message


def _union_error(message: str, key: str) -> str:
    """A union type's refusal as one line: the types accepted and the value given (or the inner key's own error)."""
    subtypes = re.search(r"Subtypes: \[(.*)\]", message)
    found = re.findall(r"<class '([^']+)'>|\b(list|dict|tuple)\[", subtypes.group(1) if subtypes else "")
    names = [(b and f"a {b}") or a.rsplit(".", 1)[-1].replace("NoneType", "null") for a, b in found]
    given = re.search(r"^\s*Given value: (.*)$", message, flags=re.M)
    value = given.group(1).strip() if given else "?"
    inner = re.search(r'Parser key "([^"]+)":\s*\n\s*(Expected a <class \'[^\']+\'>\. Got value: .*)', message)
    if inner:  # a class's own argument: that argument's error
        return f"--{key}.{inner.group(1)}: {_plain_type_error(inner.group(2))}"
    literal = re.findall(r"Literal\[([^\]]*)\]", subtypes.group(1) if subtypes else "")
    choices = list(dict.fromkeys(c.strip().strip("'\"") for group in literal for c in group.split(",")))
    near = _nearest(value, choices)
    if choices:
        names = [f"one of {', '.join(choices)}"] + [n for n in names if n in ("int", "float", "null")]
    classes = [a for a, _ in found if a and "." in a and not a.startswith(("builtins", "typing"))]
    if classes and re.fullmatch(r"[A-Z]\w*", value):  # a class name of a base class: the near ones
        return unknown_class_name(key, value, classes[0])
    return f"--{key}: expected {' or '.join(dict.fromkeys(names)) or 'another type'}, got {value!r}{near}"


def unknown_class_name(key: str, given: str, base: str) -> str:
    """One line for ``--model CEModul``: no class of that name, the near ones among the imported subclasses of ``base``."""
    names: set[str] = set()
    root = import_class(base)
    todo: list[type] = [root] if root is not None else []
    seen: set[type] = set()
    while todo:
        cls = todo.pop()
        subs: list[type] = type.__subclasses__(cls)
        for sub in subs:
            if sub not in seen:
                seen.add(sub)
                todo.append(sub)
                if not sub.__name__.startswith("_"):
                    names.add(sub.__name__)
    starts = sorted(n for n in names if n.lower().startswith(given.lower()))
    near = f"; did you mean {' or '.join(starts[:3])}?" if starts else _nearest(given, names)
    known = f"; known: {', '.join(sorted(names)[:12])}{' ...' if len(names) > 12 else ''}" if names and not near else ""
    return f"--{key} {given}: no class of that name{near}{known} (a class of your own: its full dotted path, package.module.Class)"


def class_path_problem(key: str, class_path: str, inner: str) -> str | None:
    """One line for a class path that does not import: the module not found (where it was looked for, the fix), or
    a module without that class (its file, the near names); ``None`` for other problems.
    """
    import importlib
    import os

    cwd = os.getcwd()
    missing = re.search(r"No module named '([^']+)'", inner)
    if missing:
        module = missing.group(1)
        top = module.split(".", 1)[0]
        return (
            f"--{key} {class_path}: no module named '{module}', looked for from {cwd} (the working folder) and the Python "
            f"path; run the command in the folder that holds {top}/, add that folder to PYTHONPATH, or install your package "
            f"(pip install -e .)"
        )
    attr = re.search(r"module '([^']+)' has no attribute '([^']+)'", inner)
    if not attr:
        return None
    module, name = attr.group(1), attr.group(2)
    try:
        mod = importlib.import_module(module)
    except Exception:  # noqa: BLE001 - only the message's detail depends on it
        return None
    if name == class_path.rsplit(".", 1)[-1]:
        where = getattr(mod, "__file__", None) or module
        names = [n for n in dir(mod) if not n.startswith("_") and isinstance(getattr(mod, n, None), type)]
        return f"--{key} {class_path}: module '{module}' ({where}) has no class '{name}'{_nearest(name, names)}"
    return (
        f"--{key} {class_path}: module '{module}' has no submodule or attribute '{name}' (looked for from {cwd}); check "
        "the dotted path: package.module.Class"
    )


def _plain_type_error(text: str) -> str:
    m = re.match(r"Expected a <class '([^']+)'>\. Got value:\s*(\S*)", text.strip())
    if m:
        return f"expected {m.group(1)}, got {m.group(2)!r}"
    m = re.match(r"Expected a typing\.Literal\[(.*)\]\. Got value:\s*(\S*)", text.strip())
    if m:  # a choice: the values accepted, as they are typed
        return f"expected one of {', '.join(v.strip().strip(chr(39)) for v in m.group(1).split(','))}; got {m.group(2)!r}"
    return text.strip()


_LINKED_NUM_CLASSES = "linked: the data module's num_classes; a value given must equal it"


def _linked_num_classes(action: argparse.Action) -> argparse.Action:
    """``action`` as the help shows it: the model's ``num_classes`` is not required on the command line.

    The CLI fills it from the data module (:meth:`CLOCLightningCLI.num_classes_from_data`), so
    ``--model.help CEModule`` must not list it as ``(required)``; every other action is returned as is.
    """
    dest = action.dest or ""
    if not (action.required and (dest == "model.init_args.num_classes" or "--model.num_classes" in action.option_strings)):
        return action
    shown = copy.copy(action)
    shown.required = False
    shown.default = argparse.SUPPRESS  # not "default: null": the link gives it
    shown.help = f"{action.help or ''} ({_LINKED_NUM_CLASSES})".strip()
    return shown


class CLOCCLIHelpFormatter(CLOCHelpFormatter):
    """:class:`CLOCHelpFormatter` that shows the model's ``num_classes`` as linked from the data module."""

    def add_usage(self, usage: str | None, actions: Iterable[argparse.Action], groups: Iterable[Any], prefix: str | None = None) -> None:
        super().add_usage(usage, [_linked_num_classes(a) for a in actions], groups, prefix)

    def add_argument(self, action: argparse.Action) -> None:
        super().add_argument(_linked_num_classes(action))


class CLOCArgumentParser(LightningArgumentParser):
    """LightningCLI's parser with plain-text help (:class:`CLOCHelpFormatter`) and short parse errors.

    A parse error is printed as one ``error:`` line naming the key (and, for an unknown key,
    the nearest valid ones) and exits with code 2, as argparse does; ``--debug`` (or
    ``CLOC_LIGHTNING_DEBUG=1``) shows jsonargparse's usage and full message instead.
    """

    #: set by :func:`main` from ``--debug``: print jsonargparse's full message instead of the short one
    full_errors = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", CLOCCLIHelpFormatter)
        kwargs.setdefault("allow_abbrev", False)  # --trainer.max_epoch is a typo, not max_epochs
        super().__init__(*args, **kwargs)

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        argv = list(getattr(self, "args", None) or sys.argv[1:])
        if not self.exit_on_error:
            super().error(message, ex)
        if self.full_errors or debug_requested(sys.argv):
            found = yaml_parse_error(message, argv)  # the parser's message calls a YAML text "<unicode string>"
            if found:
                print(f"{found}", file=sys.stderr, flush=True)
            super().error(message, ex)
        exit_with_parse_error(getattr(ex, "subcommand_parser", None) or self, message, argv)


def exit_with_parse_error(parser: Any, message: str, argv: list[str]) -> NoReturn:
    """Print a jsonargparse parse error of ``parser`` as one ``<prog>: error:`` line (:func:`short_parse_error`) and exit 2.

    Used by :class:`CLOCArgumentParser` and, for the jsonargparse parsers of the other sub-commands (``probe``,
    ``data optimize``), by :func:`cloc_lightning.cli.main`.
    """
    prog = str(getattr(parser, "prog", "cloc-lightning")).replace(" [options]", "")
    short = short_parse_error(message, parser, argv)
    print(
        f"{prog}: error: {short}\n({prog} --help lists the options; --debug shows the parser's full message)",
        file=sys.stderr,
        flush=True,
    )
    raise SystemExit(2)


# ---------------------------------------------------------------------------------------------- required settings
#: the start of a config value that must be given: ``"REQUIRED: --model.learnable_map <phase-one run folder>/cloc_margins.yaml"``
#: (the phase-two configs' margins YAML and weights: ``null`` would mean something else, e.g. "all margins learnable")
REQUIRED_MARK = "REQUIRED:"


def required_placeholders(config: Any, prefix: str = "") -> list[tuple[str, str]]:
    """``(key, value)`` of every value of a parsed config (a Namespace or dict) still holding a :data:`REQUIRED_MARK` placeholder."""
    data = config.as_dict() if hasattr(config, "as_dict") else config
    found: list[tuple[str, str]] = []
    if isinstance(data, dict):
        for key, value in data.items():
            found.extend(required_placeholders(value, f"{prefix}{key}."))
    elif isinstance(data, (list, tuple)):
        for i, value in enumerate(data):
            found.extend(required_placeholders(value, f"{prefix}{i}."))
    elif isinstance(data, str) and data.startswith(REQUIRED_MARK):
        found.append((prefix.rstrip("."), data))
    return found


def check_required_placeholders(config: Any, argv: list[str]) -> None:
    """Refuse a run whose config still holds ``REQUIRED: ...`` placeholders (one line: the file, the settings, what to give)."""
    found = required_placeholders(config)
    if not found:
        return
    files = []
    for path in _config_paths(argv):
        try:
            with open(path) as f:
                text = f.read()
        except (OSError, UnicodeDecodeError):
            continue
        if any(value in text for _, value in found):
            files.append(path)
    where = ", ".join(files) if files else "the config"
    keys = ", ".join(key for key, _ in found)
    give = " ".join(value[len(REQUIRED_MARK) :].strip() for _, value in found)
    raise ValueError(
        f"{where}: {keys} {'is a required setting' if len(found) == 1 else 'are required settings'} that "
        f"this run does not give (the config holds the placeholder {found[0][1]!r}); give {give}"
    )
