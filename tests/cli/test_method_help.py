"""``--model.help`` of every method documents every option and shows the method's own defaults; ``--print_config`` too.

The optimiser / schedule / online-probe arguments are declared once (``BaseModule``,
``PretrainModule``, ``MomentumModule``); a method re-declares only an argument whose default or meaning it changes
and passes the rest on with ``**kwargs``, which jsonargparse follows.  What a user sees must still be complete: every ``--model.<name>`` with a description, and each default as
the method's constructor has it -- checked against the constructors walked here independently and
against the references' values.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import pytest
import yaml

import cloc_lightning.methods as methods
from cloc_lightning.cli import main
from tests.methods.test_method_defaults import METHOD_DEFAULTS, constructor_chain

METHODS = [
    "CEModule",
    "CLOCModule",
    "SupConModule",
    "RnCModule",
    "ReLICModule",
    "LinearProbeModule",
    "LinearRegressorModule",
    "OrdinalCLIPModule",
    "OrdinalRegressionModule",
]
#: an option's first line: ``--model.<name> METAVAR`` (lists also ``, --model.<name>+ METAVAR``), maybe its help
_OPTION = re.compile(r"^  --model\.(\w+)(?: \S+)?(?:, --model\.\w+\+ \S+)?(?: {2,}(.*))?$")


def _expected_defaults(cls: type) -> dict[str, Any]:
    """``{argument: default}`` of ``cls``'s constructor chain: each ``__init__`` up the MRO until one without ``**kwargs``."""
    found: dict[str, Any] = {}
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        params = list(inspect.signature(init).parameters.values())[1:]
        for p in params:
            if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
                found.setdefault(p.name, p.default)
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            return found
    raise AssertionError(f"{cls.__name__}: no constructor without **kwargs up the MRO")


def _shown(value: Any) -> str:
    """A default as jsonargparse's help prints it."""
    if value is inspect.Parameter.empty:
        return "<required>"
    return "null" if value is None else str(value)


def _help_options(text: str) -> dict[str, tuple[str, str]]:
    """``{name: (description, default as shown or '<required>')}`` of every ``--model.<name>`` in a help text."""
    blocks: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        m = _OPTION.match(line)
        if m:
            current = blocks.setdefault(m.group(1), [m.group(2) or ""])
        elif current is not None and line.startswith(" " * 24):
            current.append(line.strip())
        else:
            current = None
    options = {}
    for name, lines in blocks.items():
        joined = " ".join(part for part in lines if part)
        tail = re.search(r"\((required, )?type: .*?(?:, default: (.*))?\)$", joined)
        assert tail, (name, joined)
        default = "<required>" if tail.group(1) else (tail.group(2) or "")
        options[name] = (joined[: tail.start()].strip(), default)
    return options


@pytest.mark.parametrize("name", METHODS)
def test_model_help_documents_every_option_with_the_methods_default(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    cls = getattr(methods, name)
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--model.help", name])
    assert exit_.value.code == 0
    options = _help_options(capsys.readouterr().out)
    expected = _expected_defaults(cls)
    assert set(options) == set(expected), set(options) ^ set(expected)
    undocumented = [option for option, (description, _) in options.items() if not description]
    assert not undocumented, f"{name}: options without a description: {undocumented}"
    if expected.get("num_classes", None) is inspect.Parameter.empty:
        # required by the constructor, but the CLI links it from the data module: shown as linked, not "(required)"
        description, shown = options.pop("num_classes")
        assert "linked: the data module's num_classes" in description and shown == "", (name, description, shown)
    wrong = {o: (shown, _shown(expected[o])) for o, (_, shown) in options.items() if shown != _shown(expected[o])}
    assert not wrong, f"{name}: defaults shown vs the constructor's: {wrong}"
    for option, value in METHOD_DEFAULTS.get(cls, {}).items():  # the references' values, independently of the signature
        assert options[option][1] == _shown(value), (name, option)


@pytest.mark.parametrize(
    ("name", "option", "words"),
    [
        ("OrdinalCLIPModule", "weight_decay", "every group except the logit scale"),
        ("OrdinalCLIPModule", "backbone", "for image_encoder: timm"),
        ("ReLICModule", "beta", "seed --beta"),
    ],
)
def test_an_argument_whose_meaning_a_method_changes_shows_the_methods_text(
    name: str, option: str, words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: ``--model.help`` showed the base class's wording (e.g. "weight decay of the default group")."""
    with pytest.raises(SystemExit):
        main(["fit", "--model.help", name])
    description, _ = _help_options(capsys.readouterr().out)[option]
    assert words in description, (name, option, description)


@pytest.mark.parametrize("cls", list(METHOD_DEFAULTS), ids=lambda c: c.__name__)
def test_print_config_shows_the_methods_defaults(cls: type, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--model", cls.__name__, "--model.num_classes", "6", "--data", "OrdinalShapesDataModule", "--print_config"])
    assert exit_.value.code in (0, None)
    init_args = yaml.safe_load(capsys.readouterr().out)["model"]["init_args"]
    # num_classes is linked from the data module (cloc_lightning.cli): jsonargparse leaves link targets out
    assert set(init_args) == set(constructor_chain(cls)) - {"num_classes"}
    for option, value in METHOD_DEFAULTS[cls].items():
        assert init_args[option] == value, (cls.__name__, option)
