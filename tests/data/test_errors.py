"""The data modules' configuration error (``cloc_lightning.data.errors``): one exception type, the check's own message."""

from __future__ import annotations

import pytest

from cloc_lightning.data.errors import DataConfigError, check_val_fraction, config_errors


def test_config_errors_turn_argument_errors_into_data_config_errors() -> None:
    assert issubclass(DataConfigError, ValueError)
    for raised in (ValueError("batch_size must be >= 1, got 0"), TypeError("batch_size must be an int, got 'x' (str)")):
        with pytest.raises(DataConfigError) as info, config_errors():
            raise raised
        assert str(info.value) == str(raised) and info.value.__cause__ is raised
    original = DataConfigError("no class folders")
    with pytest.raises(DataConfigError) as info, config_errors():
        raise original
    assert info.value is original and info.value.__cause__ is None
    with pytest.raises(RuntimeError, match="not an argument error"), config_errors():  # anything else passes unchanged
        raise RuntimeError("not an argument error")


def test_check_val_fraction() -> None:
    assert check_val_fraction(0) == 0.0 and check_val_fraction(0.25) == 0.25
    for bad, shown in ((1.0, "1.0"), (-0.1, "-0.1"), ("x", "'x' (str)"), (float("nan"), "nan")):
        with pytest.raises(DataConfigError) as info:
            check_val_fraction(bad)
        assert str(info.value) == f"val_fraction must be in [0, 1), got {shown}; 0 = validate on the test set"
