"""The system prompt: named, ordered sections rendered as strict `{{name}}` templates.

Template rules (strict, so a typo fails loudly instead of reaching the model as literal text):

- A group is `{{` followed by the next `}}`. Its inside, with surrounding spaces and tabs
  stripped, must be a name matching `^[a-z][a-z0-9_]*$`; anything else (`{{ }}`, `{{Bad}}`,
  `{{a b}}`, a newline, a nested `{{`) raises `PromptError`.
- A name that is not a registered variable raises, listing the registered ones; a registered
  variable whose value is None (known but unset) raises too.
- A `{{` with no `}}` anywhere after it is literal text, as is a lone `}}`.
- Substituted values are inserted verbatim and never re-scanned, so a value containing `{{x}}`
  cannot inject a lookup.

Sections are scoped: `SystemPrompt(parent=p)` sees `p`'s sections and may shadow one by name
(e.g. a child's persona under `PERSONA_SECTION`) for itself alone; `p` is unaffected.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache

from agent.edits import EDITS
from agent.errors import PromptError

__all__ = [
    "PERSONA_SECTION",
    "PromptError",
    "SystemPrompt",
    "check_template",
    "render_template",
    "template_names",
]

PERSONA_SECTION = "deployment:persona"
DEFAULT_ORDER = 100

VARIABLE_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
_OPEN, _CLOSE = "{{", "}}"
_versions = itertools.count(1)
_seqs = itertools.count()


# A parsed template: literal strings and variable names (as 1-tuples), alternating freely.
_Piece = str | tuple[str]


@lru_cache(maxsize=512)
def _parse(template: str) -> tuple[_Piece, ...]:
    pieces: list[_Piece] = []
    pos = 0
    while True:
        start = template.find(_OPEN, pos)
        if start < 0:
            break
        end = template.find(_CLOSE, start + 2)
        if end < 0:
            break  # an unclosed `{{` is literal
        inner = template[start + 2 : end]
        name = inner.strip(" \t")
        if not VARIABLE_NAME_RE.fullmatch(name):
            raise PromptError(
                f"malformed template group {template[start : end + 2]!r} at offset {start}: "
                f"expected {{{{name}}}} with name matching {VARIABLE_NAME_RE.pattern}"
            )
        if start > pos:
            pieces.append(template[pos:start])
        pieces.append((name,))
        pos = end + 2
    if pos < len(template):
        pieces.append(template[pos:])
    return tuple(pieces)


def template_names(template: str) -> list[str]:
    """The variable names a template uses, in order of first use; raises on a malformed group."""
    seen: dict[str, None] = {}
    if _OPEN in template:
        for p in _parse(template):
            if isinstance(p, tuple):
                seen.setdefault(p[0], None)
    return list(seen)


def check_template(template: str, registered: Mapping[str, object] | set[str]) -> None:
    """Raise `PromptError` unless every name `template` uses is registered.

    Lets a caller reject a bad persona before a child exists, when the values may not be set yet.
    """
    names = set(registered)
    for name in template_names(template):
        if name not in names:
            raise PromptError(_unknown_message(name, names))


def _unknown_message(name: str, registered: set[str] | Mapping[str, object]) -> str:
    listing = ", ".join(sorted(registered)) or "(none)"
    return f"unknown template variable {name!r}; registered variables: {listing}"


def render_template(template: str, variables: Mapping[str, str | None]) -> str:
    """Substitute `{{name}}` groups strictly (see the module docstring for the rules)."""
    if _OPEN not in template:
        return template
    out: list[str] = []
    for p in _parse(template):
        if isinstance(p, str):
            out.append(p)
            continue
        name = p[0]
        if name not in variables:
            raise PromptError(_unknown_message(name, variables))
        value = variables[name]
        if value is None:
            raise PromptError(f"template variable {name!r} is registered but has no value")
        if not isinstance(value, str):
            raise PromptError(
                f"template variable {name!r} must be a string, got {type(value).__name__}"
            )
        out.append(value)
    return "".join(out)


@dataclass(frozen=True, slots=True, eq=False)
class _Section:
    name: str
    text: str
    order: int
    seq: int  # global creation sequence: ties on `order` render in insertion order


class SystemPrompt:
    """Ordered sections, optionally layered over a parent prompt, rendered with a cache.

    Sections render by `(order, insertion)`, each as a template, joined by a blank line;
    a section rendering to empty text is skipped (so shadowing with "" hides a parent section).
    """

    def __init__(self, parent: SystemPrompt | None = None) -> None:
        self._parent = parent
        self._sections: dict[str, _Section] = {}
        self._version = next(_versions)
        self._merged_key: tuple[int, ...] | None = None
        self._merged: tuple[_Section, ...] = ()
        self._render_key: tuple[tuple[int, ...], dict[str, str | None]] | None = None
        self._rendered = ""

    @property
    def parent(self) -> SystemPrompt | None:
        return self._parent

    @property
    def version(self) -> int:
        """Changes whenever this scope's own sections change (a render-cache key part)."""
        return self._version

    def set_section(self, name: str, text: str, order: int = DEFAULT_ORDER) -> Callable[[], None]:
        """Add or replace this scope's section `name`; returns an idempotent remove function.

        Replacing keeps the section's insertion position. The template is parsed here, so a
        malformed one fails at registration rather than on the next model request.
        """
        if not isinstance(name, str) or not name:
            raise ValueError("section name must be a non-empty string")
        if not isinstance(text, str):
            raise TypeError(f"section text must be a string, got {type(text).__name__}")
        if not isinstance(order, int) or isinstance(order, bool):
            raise TypeError("section order must be an int")
        try:
            template_names(text)
        except PromptError as exc:
            raise PromptError(f"section {name!r}: {exc}") from None
        old = self._sections.get(name)
        entry = _Section(name, text, order, old.seq if old is not None else next(_seqs))
        self._sections[name] = entry
        self._version = next(_versions)
        EDITS.bump()

        def remove() -> None:
            if self._sections.get(name) is entry:
                del self._sections[name]
                self._version = next(_versions)
                EDITS.bump()

        return remove

    def has_section(self, name: str) -> bool:
        """Whether `name` is visible here (own or inherited)."""
        return any(s.name == name for s in self.merged_sections())

    def section_text(self, name: str) -> str | None:
        """The unrendered text of the visible section `name`, or None."""
        for s in self.merged_sections():
            if s.name == name:
                return s.text
        return None

    def section_names(self) -> list[str]:
        """Visible section names in render order."""
        return [s.name for s in self.merged_sections()]

    def _key(self) -> tuple[int, ...]:
        key = []
        scope: SystemPrompt | None = self
        while scope is not None:
            key.append(scope.version)
            scope = scope.parent
        return tuple(key)

    def merged_sections(self) -> tuple[_Section, ...]:
        """This scope's visible sections, inherited ones included, in render order."""
        key = self._key()
        if key != self._merged_key:
            merged: dict[str, _Section] = {}
            if self._parent is not None:
                merged.update((s.name, s) for s in self._parent.merged_sections())
            merged.update(self._sections)  # own sections shadow inherited ones by name
            self._merged = tuple(sorted(merged.values(), key=lambda s: (s.order, s.seq)))
            self._merged_key = key
        return self._merged

    def render(self, variables: Mapping[str, str | None]) -> str:
        """The full system prompt; cached until a section (here or above) or a value changes.

        A scope with no sections of its own (most children's) renders exactly what its parent
        does: it asks the parent, so siblings share one rendering (and one string)."""
        parent = self._parent
        if parent is not None and not self._sections:
            return parent.render(variables)
        key = self._key()
        if self._render_key is not None:
            cached_key, cached_vars = self._render_key
            if cached_key == key and cached_vars == variables:
                return self._rendered
        parts = []
        for s in self.merged_sections():
            try:
                text = render_template(s.text, variables)
            except PromptError as exc:
                raise PromptError(f"section {s.name!r}: {exc}") from None
            if text:
                parts.append(text)
        self._rendered = "\n\n".join(parts)
        self._render_key = (key, dict(variables))
        return self._rendered
