"""Direct tests of :mod:`cloc_lightning.validation`: the one set of argument checks every layer uses.

Each check is exercised on the values it must take, the ones it must refuse (with the error type
and the message's parts: the name, what it must be, what it got, the hint), and its edge cases
(``bool`` is not an int, NaN is never a number, a one-element tensor is taken).
"""

from __future__ import annotations

import math
from typing import Literal, Optional, Union

import pytest
import torch

from cloc_lightning.validation import check_bool, check_choice, check_float, check_int, check_tensor, choices

Mode = Literal["a", "b"]


@pytest.mark.parametrize(
    ("literal", "expected"),
    [
        (Literal["x"], ("x",)),
        (Mode, ("a", "b")),
        (Optional[Mode], ("a", "b")),  # noqa: UP045 - the typing.Optional form is what is tested
        (Union[Mode, Literal["b", "c"]], ("a", "b", "c")),  # noqa: UP007 - typing.Union; order kept, duplicates once
        (Mode | None, ("a", "b")),
        (Literal[1, 2, None], (1, 2, None)),
    ],
)
def test_choices_reads_literal_types(literal: object, expected: tuple[object, ...]) -> None:
    assert choices(literal) == expected


@pytest.mark.parametrize("not_literal", [int, str, Optional[int], list[str]])  # noqa: UP045
def test_choices_refuses_other_types(not_literal: object) -> None:
    with pytest.raises(TypeError, match="is not a Literal type"):
        choices(not_literal)


def test_check_choice_message_names_every_option_and_the_hint() -> None:
    assert check_choice("mode", "b", Mode) == "b"
    assert check_choice("mode", 3, (1, 2, 3)) == 3
    with pytest.raises(ValueError) as e:
        check_choice("mode", "z", Mode, hint="see docs/x.md")
    assert str(e.value) == "mode must be 'a' or 'b', got 'z'; see docs/x.md"
    with pytest.raises(ValueError, match=r"^k must be 'p', 'q' or 'r', got 's'$"):
        check_choice("k", "s", ["p", "q", "r"])
    with pytest.raises(ValueError, match=r"^k must be 'p', got 'P'$"):  # case matters
        check_choice("k", "P", ("p",))


def test_check_int() -> None:
    assert check_int("n", 3) == 3 and type(check_int("n", 3)) is int
    assert check_int("n", torch.tensor(4)) == 4  # a one-element integer tensor
    assert check_int("n", 5, 5, maximum=5) == 5  # bounds inclusive
    for bad in (True, 2.0, "2", None, torch.tensor([1, 2]), torch.tensor(1.0)):
        with pytest.raises(TypeError, match=r"^n must be an int, got "):
            check_int("n", bad)
    with pytest.raises(ValueError, match=r"^n must be >= 1, got 0; or null$"):
        check_int("n", 0, 1, hint="or null")
    with pytest.raises(ValueError, match=r"^n must be <= 9, got 10$"):
        check_int("n", 10, maximum=9)
    with pytest.raises(ValueError, match=r"^n must be a positive count, got -1$"):
        check_int("n", -1, 1, expect="a positive count")


def test_check_float() -> None:
    assert check_float("t", 1) == 1.0 and type(check_float("t", 1)) is float
    assert check_float("t", torch.tensor(0.5)) == 0.5
    assert check_float("t", math.inf, allow_inf=True) == math.inf
    with pytest.raises(ValueError, match="finite number, got nan"):
        check_float("t", math.nan, allow_inf=True)  # NaN is never allowed
    with pytest.raises(ValueError, match="finite number, got inf"):
        check_float("t", math.inf)
    with pytest.raises(TypeError, match=r"a quoted string in YAML\?"):
        check_float("t", "0.1")
    with pytest.raises(TypeError, match=r"^t must be a number, got 'abc' \(str\)$"):
        check_float("t", "abc")
    with pytest.raises(TypeError):
        check_float("t", False)
    assert check_float("t", 0.0, minimum=0.0) == 0.0
    with pytest.raises(ValueError, match=r"^t must be > 0.0, got 0.0$"):
        check_float("t", 0.0, minimum=0.0, strict_minimum=True)
    assert check_float("t", 1.0, maximum=1.0) == 1.0
    with pytest.raises(ValueError, match=r"^t must be < 1.0, got 1.0$"):
        check_float("t", 1.0, maximum=1.0, strict_maximum=True)
    with pytest.raises(ValueError, match=r"^t must be a positive float \(e.g. 0.07\), got -0.1; lower it$"):
        check_float("t", -0.1, minimum=0.0, strict_minimum=True, expect="a positive float (e.g. 0.07)", hint="lower it")


def test_check_tensor() -> None:
    x = torch.zeros(2, 3)
    assert check_tensor("x", x, dim=2, floating=True, non_empty=True) is x
    assert check_tensor("x", x, dim=(1, 2)) is x
    with pytest.raises(TypeError, match=r"^x must be a torch.Tensor \[batch, dim\], got list$"):
        check_tensor("x", [1.0], layout="[batch, dim]")
    with pytest.raises(ValueError, match=r"^x must be 1-D or 3-D \[b\], got shape \(2, 3\)$"):
        check_tensor("x", x, dim=(1, 3), layout="[b]")
    with pytest.raises(TypeError, match=r"floating-point tensor, got dtype torch.int64; cast with .float\(\)"):
        check_tensor("x", torch.zeros(2, dtype=torch.long), floating=True)
    with pytest.raises(TypeError, match=r"^y must hold integer class ids, got dtype torch.float32; cast with .long\(\)$"):
        check_tensor("y", torch.zeros(2), floating=False, holding="class ids")
    with pytest.raises(TypeError, match="must hold integers, got dtype torch.bool"):
        check_tensor("y", torch.zeros(2, dtype=torch.bool), floating=False)
    with pytest.raises(ValueError, match=r"^x must be non-empty, got shape \(0, 3\)$"):
        check_tensor("x", torch.zeros(0, 3), non_empty=True)


def test_check_bool() -> None:
    assert check_bool("b", True) is True and check_bool("b", False) is False
    for bad in ("no", "true", 0, 1, None, torch.tensor(True)):
        with pytest.raises(TypeError, match=r"^b must be True or False, got .*; write true or false$"):
            check_bool("b", bad, hint="write true or false")
