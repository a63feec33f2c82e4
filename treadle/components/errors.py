"""ConfigError: one message naming the key path, the value and what was expected."""

from __future__ import annotations

from typing import Any

from treadle.suggest import did_you_mean  # the one ranking of close names, re-exported for the config messages

_MISSING = object()


def short_repr(value: Any, limit: int = 80) -> str:
    """``repr`` cut to ``limit`` characters, so a message stays one readable line."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ConfigError(ValueError):
    """A config problem found before anything runs.

    ``str(err)`` reads ``<key path>: <problem> (got <value>); expected <expected>.<hint>``,
    e.g. ``optimizer.lr: out of range (got -0.1); expected a number >= 0``. ``source``
    (the config file) is kept apart so the command line can print it first.
    """

    def __init__(self, path: str, problem: str, *, value: Any = _MISSING, expected: str = "", hint: str = "",
                 source: str | None = None) -> None:
        self.path = path
        self.problem = problem
        self.value = value
        self.expected = expected
        self.hint = hint
        self.source = source
        super().__init__(self._format())

    def _format(self) -> str:
        text = f"{self.path}: {self.problem}" if self.path else self.problem
        if self.value is not _MISSING:
            text += f" (got {short_repr(self.value)})"
        if self.expected:
            text += f"; expected {self.expected}"
        if self.hint:
            text += ("" if text.endswith(".") else ".") + " " + self.hint.strip()
        return text

    def at(self, path: str, problem: str | None = None) -> "ConfigError":
        """The same error under another key path (and ``problem``, when given)."""
        return ConfigError(path, self.problem if problem is None else problem, value=self.value,
                           expected=self.expected, hint=self.hint, source=self.source)

    def with_source(self, source: str | None) -> "ConfigError":
        """The same error, attributed to the config file ``source`` (kept if already set)."""
        if self.source is None:
            self.source = source
        return self


def join_path(parent: str, key: Any) -> str:
    """``optimizer`` + ``lr`` -> ``optimizer.lr``; list indices as ``hooks[0]``."""
    if isinstance(key, int):
        return f"{parent}[{key}]"
    return f"{parent}.{key}" if parent else str(key)


__all__ = ["ConfigError", "did_you_mean", "join_path", "short_repr"]
