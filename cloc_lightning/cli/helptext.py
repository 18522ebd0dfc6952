"""Command-line help as plain text: docstrings' reST markup (roles, double-backtick literals) as a terminal shows it.

Used by every ``cloc-lightning`` parser: the LightningCLI one (:mod:`cloc_lightning.cli.parser`) and the
sub-commands' (:mod:`cloc_lightning.cli.commands`).  This module imports nothing else from the package.
"""

from __future__ import annotations

import argparse
import re

from jsonargparse import DefaultHelpFormatter

__all__ = ["CLOCHelpFormatter", "rst_to_text"]

_RST_ROLE = re.compile(r":(?:[a-z]+:)?[a-z]+:`~?([^`<]*?)\s*(?:<([^`>]*)>)?`")
_RST_LITERAL = re.compile(r"``(.+?)``")


def rst_to_text(text: str) -> str:
    """Docstring reST as a terminal shows it: ``:class:`~a.b.C``` -> ``C``, ``:mod:`a.b``` -> ``a.b``,
    ```` ``x`` ```` -> ``x``, ``:ref:`text <target>``` -> ``text``; anything else is left as written."""

    def role(m: re.Match[str]) -> str:
        shown = m.group(1).strip()
        whole = m.group(0)
        if "`~" in whole and not m.group(2):
            shown = shown.rsplit(".", 1)[-1]
        return shown or (m.group(2) or "").strip()

    return _RST_LITERAL.sub(r"\1", _RST_ROLE.sub(role, text))


class CLOCHelpFormatter(DefaultHelpFormatter):
    """jsonargparse's help formatter with the docstrings' reST markup (roles, double-backtick literals) as plain text."""

    def _get_help_string(self, action: argparse.Action) -> str:
        return rst_to_text(super()._get_help_string(action))

    def add_text(self, text: str | None) -> None:
        super().add_text(rst_to_text(text) if text else text)

    def start_section(self, heading: str | None) -> None:
        super().start_section(rst_to_text(heading) if heading else heading)
