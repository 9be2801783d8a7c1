"""Cancellation and supervision: the bottom layer. It knows gevent and nothing else of ours."""

from supervision.signal import AbortController, AbortError, AbortSignal

__all__ = ["AbortController", "AbortError", "AbortSignal"]
