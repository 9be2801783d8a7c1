"""Text from a model, an agent or a file, made safe to show on a terminal.

Such text is data. Two things could turn it into something else on the way to the screen:
rich markup (`[b]`, `[/i]`, `[link=...]` are parsed, lost, or raise `MarkupError`) and terminal
control sequences (ESC/CSI/OSC and the other C0/C1 controls, bidi overrides, lone surrogates).
Every command prints through `DataConsole`, whose only way from a `str` to the screen is
`render_str`: it never parses markup or emoji codes and shows every control character as a
visible escape (`\\x1b`). Renderables the CLI builds itself (`rich.text.Text`) take their
strings through `shown()` or `data()`; styles come only from our own code.
"""

from __future__ import annotations

import re
from typing import IO, TYPE_CHECKING

from rich.console import Console
from rich.text import Text

if TYPE_CHECKING:
    from rich.console import HighlighterType, JustifyMethod, OverflowMethod
    from rich.style import Style

__all__ = ["DataConsole", "data", "shown"]

# C0 except TAB and LF, DEL, C1, the bidi embeddings/overrides/isolates, and lone surrogates.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_UNSAFE_LINE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown(text: str, *, one_line: bool = False) -> str:
    """`text` with every control character replaced by a visible escape (`\\x1b`, `\\u202e`).

    TAB and newlines are kept unless `one_line` (then they are escaped too). Plain printable
    text comes back unchanged (and fast: the check is one regex search).
    """
    pattern = _UNSAFE_LINE if one_line else _UNSAFE
    if pattern.search(text) is None:
        return text
    return pattern.sub(_escape, text)


def data(text: str, style: str | Style = "", *, one_line: bool = False) -> Text:
    """A rich `Text` holding `text` as data: no markup is parsed, controls are escaped."""
    return Text(shown(text, one_line=one_line), style=style)


class DataConsole(Console):
    """A rich console on which every string is data (see the module docstring)."""

    def __init__(self, file: IO[str], *, plain: bool) -> None:
        if plain:
            # Scripts and tests: a fixed width and no styling, so captures are stable.
            super().__init__(
                file=file,
                width=100,
                no_color=True,
                soft_wrap=True,
                markup=False,
                emoji=False,
                highlight=False,
            )
        else:
            super().__init__(file=file, markup=False, emoji=False, highlight=False)

    def render_str(
        self,
        text: str,
        *,
        style: str | Style = "",
        justify: JustifyMethod | None = None,
        overflow: OverflowMethod | None = None,
        emoji: bool | None = None,
        markup: bool | None = None,
        highlight: bool | None = None,
        highlighter: HighlighterType | None = None,
    ) -> Text:
        # Whatever a caller asks for, a str is never markup and never an emoji code.
        return super().render_str(
            shown(text),
            style=style,
            justify=justify,
            overflow=overflow,
            emoji=False,
            markup=False,
            highlight=highlight,
            highlighter=highlighter,
        )
