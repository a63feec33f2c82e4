"""pytest plugin for the shim's second pass: ``assertRaises``/``assertRaisesRegex`` accept
any ``Exception`` and the test goes on, so that the behaviour checked after an error
case still runs. Each relaxed check whose exception class or message text differs is
recorded, with what was expected and what treadle raised, in the JSON file named by
``$SHIM_RELAXED_OUT``. A call that raises nothing still fails.
"""

from __future__ import annotations

import json
import os
import re
import unittest
from typing import Any

_RECORDS: list[dict[str, Any]] = []
_ORIGINAL = unittest.TestCase.assertRaises


class _Relaxed:
    """Wraps unittest's own context with ``Exception`` and compares afterwards."""

    def __init__(self, case: unittest.TestCase, expected: Any, regex: Any) -> None:
        self.case, self.expected, self.regex = case, expected, regex

    def __enter__(self) -> Any:
        self.inner = _ORIGINAL(self.case, Exception)
        return self.inner.__enter__()

    def __exit__(self, kind: Any, value: Any, tb: Any) -> bool:
        handled = self.inner.__exit__(kind, value, tb)  # fails the test if nothing was raised
        got = self.inner.exception
        wrong_class = not isinstance(got, self.expected)
        wrong_text = self.regex is not None and not re.search(self.regex, str(got))
        if wrong_class or wrong_text:
            names = self.expected if isinstance(self.expected, tuple) else (self.expected,)
            _RECORDS.append({"test": self.case.id(), "expected": "/".join(e.__name__ for e in names),
                             "expected_text": None if self.regex is None else str(self.regex),
                             "got": type(got).__name__, "got_text": str(got)})
        return handled


def _run(ctx: _Relaxed, args: tuple, kwargs: dict) -> Any:
    if not args:
        return ctx
    with ctx:
        args[0](*args[1:], **kwargs)
    return None


def _assert_raises(self: unittest.TestCase, expected: Any, *args: Any, **kwargs: Any) -> Any:
    kwargs.pop("msg", None)
    return _run(_Relaxed(self, expected, None), args, kwargs)


def _assert_raises_regex(self: unittest.TestCase, expected: Any, regex: Any, *args: Any, **kwargs: Any) -> Any:
    kwargs.pop("msg", None)
    return _run(_Relaxed(self, expected, regex), args, kwargs)


unittest.TestCase.assertRaises = _assert_raises  # type: ignore[method-assign, assignment]  # the patch is this module's purpose
unittest.TestCase.assertRaisesRegex = _assert_raises_regex  # type: ignore[method-assign, assignment]  # the patch is this module's purpose


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    """Write the recorded differences."""
    out = os.environ.get("SHIM_RELAXED_OUT")
    if out:
        with open(out, "w") as f:
            json.dump(_RECORDS, f, indent=1)
