"""Model adapters by route: `prefix:model`, e.g. `scripted:default` or `openai:gpt-4o-mini`.

The registry only maps a prefix to an adapter; the model name after the first colon is passed
through untouched (fine-tuned OpenAI names contain colons themselves).
"""

from __future__ import annotations

from collections.abc import Callable

from agent.model import ModelAdapter

__all__ = ["ModelRegistry", "parse_route"]


def parse_route(route: str) -> tuple[str, str]:
    """Split `prefix:model` at the first colon; both parts must be non-empty."""
    if not isinstance(route, str):
        raise TypeError(f"a model route must be a str, got {type(route).__name__}")
    prefix, sep, model = route.partition(":")
    if not sep or not prefix or not model or prefix != prefix.strip():
        raise ValueError(f"malformed model route {route!r}: expected 'prefix:model'")
    return prefix, model


# Routes already split (every child of a parent resolves the same route): bounded, one entry
# per route seen, cleared when full.
_parsed: dict[str, tuple[str, str]] = {}
_PARSED_MAX = 256


class ModelRegistry:
    """Prefix -> adapter. Registration returns its own undo, so a test or plugin cleans up
    exactly what it added."""

    def __init__(self) -> None:
        self._adapters: dict[str, ModelAdapter] = {}

    def register(self, prefix: str, adapter: ModelAdapter) -> Callable[[], None]:
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
        if not prefix or ":" in prefix or prefix != prefix.strip():
            raise ValueError(f"invalid model prefix {prefix!r}: non-empty, no ':' or spaces")
        if not isinstance(adapter, ModelAdapter):
            raise TypeError(f"{adapter!r} is not a ModelAdapter (it needs complete())")
        if prefix in self._adapters:
            raise ValueError(f"model prefix {prefix!r} is already registered")
        self._adapters[prefix] = adapter

        def unregister() -> None:
            # Only remove our own registration: a later one under the same prefix stays.
            if self._adapters.get(prefix) is adapter:
                del self._adapters[prefix]

        return unregister

    def resolve(self, route: str) -> tuple[ModelAdapter, str]:
        """The adapter for `route` and the model name to put in the request."""
        parsed = _parsed.get(route) if type(route) is str else None
        if parsed is None:
            parsed = parse_route(route)
            if len(_parsed) >= _PARSED_MAX:
                _parsed.clear()
            _parsed[route] = parsed
        prefix, model = parsed
        adapter = self._adapters.get(prefix)
        if adapter is None:
            known = ", ".join(sorted(self._adapters)) or "none"
            raise ValueError(f"unknown model prefix {prefix!r} in {route!r} (known: {known})")
        return adapter, model

    def prefixes(self) -> list[str]:
        return sorted(self._adapters)

    def __contains__(self, prefix: object) -> bool:
        return prefix in self._adapters
