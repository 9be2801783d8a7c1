"""Agent text made safe to show: no terminal escapes, bounded JSON-RPC error data.

Its own module so both the connection (`acp_rpc`) and the errors it raises (`errors`) use it
without importing each other.
"""

from __future__ import annotations

import json
import re
import reprlib

__all__ = [
    "MAX_DATA_CHARS",
    "MAX_SHOWN_CHARS",
    "clean_text",
    "describe_data",
    "quoted",
    "short_text",
]

# Terminal control sequences an agent's text may carry (colours, cursor moves, OSC titles and
# hyperlinks), then any other C0/C1 control character but newline and tab: agent text is data.
_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC, BEL- or ST-terminated
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"  # DCS, SOS, PM, APC
    r"|\x1b[@-Z\\-_]"  # other two-byte escapes
    r"|\x9b[0-?]*[ -/]*[@-~]"  # 8-bit CSI
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"
)

MAX_DATA_CHARS = 2000


def clean_text(text: str) -> str:
    """`text` without terminal escape sequences or control characters (newline, tab kept)."""
    return _ESCAPES.sub("", text)


def describe_data(data: object, limit: int = MAX_DATA_CHARS) -> str:
    """A JSON-RPC error's `data` as one clean, bounded string."""
    if isinstance(data, str):
        text = clean_text(data)
    else:
        try:
            text = json.dumps(_clean_strings(data), ensure_ascii=False, sort_keys=True)
        except (TypeError, ValueError, RecursionError):
            text = clean_text(repr(data))
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _clean_strings(value: object) -> object:
    """`value` with every string in it cleaned (before JSON would escape the escapes)."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {clean_text(str(k)): _clean_strings(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean_strings(v) for v in value]
    return value


# How much of one value an agent sent (a stop reason, a tool call's title, an answer that was
# no object) a diagnostic quotes: enough to recognise it, never the megabytes a line may hold.
MAX_SHOWN_CHARS = 200

_QUOTE = reprlib.Repr()
_QUOTE.maxstring = MAX_SHOWN_CHARS
_QUOTE.maxother = MAX_SHOWN_CHARS
_QUOTE.maxlong = 40
_QUOTE.maxlevel = 3
_QUOTE.maxdict = _QUOTE.maxlist = 8


def quoted(value: object) -> str:
    """A value an agent sent, quoted for a diagnostic: Python's `repr` (every control character
    escaped, so no terminal escape survives), its strings and containers cut short."""
    return _QUOTE.repr(value)


def short_text(text: str, limit: int = MAX_SHOWN_CHARS) -> str:
    """Agent text for a diagnostic: escapes stripped, at most `limit` characters (then `...`)."""
    text = clean_text(text[: limit * 2]).strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."
