""""Did you mean ...?": the known names closest to a misspelt one.

One ranking for every place that names what it expected (config keys, optimizer,
scheduler and hook types, Trainer arguments, hook points): the fewest typing slips
first (a letter wrong, missing, extra or two swapped, case ignored; a letter typed
twice counts half), then the name of the same length (a letter replaced rather than
dropped), then difflib's similarity. So ``AdamX`` suggests ``AdamW`` before ``Adam``
and ``Adamax``, and ``Adamm`` suggests ``Adam`` first. This module imports
nothing of treadle: every layer may use it.
"""

from __future__ import annotations

import difflib
from typing import Iterable


def _slips(a: str, b: str) -> int:
    """Typing slips from ``a`` to ``b``: letters replaced, dropped, added, or two
    neighbours swapped (the optimal string alignment distance)."""
    rows = [list(range(len(b) + 1))]
    for i, ca in enumerate(a, 1):
        row = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            row[j] = min(rows[-1][j] + 1, row[j - 1] + 1, rows[-1][j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                row[j] = min(row[j], rows[-2][j - 2] + 1)
        rows.append(row)
    return rows[-1][-1]


def _doubled(typed: str, name: str) -> bool:
    """``typed`` is ``name`` with one letter typed twice (``adamm``, ``adam``)."""
    return any(typed[i] == typed[i - 1] and typed[:i] + typed[i + 1:] == name for i in range(1, len(typed)))


def closest(word: str, choices: Iterable[str], n: int = 3, cutoff: float = 0.6, *, slips: bool = True) -> list[str]:
    """Up to ``n`` of ``choices`` that ``word`` may be a slip of, the likeliest first:
    those within one slip per four letters (at least one), and those difflib rates at
    ``cutoff`` or more. ``slips=False``: difflib's rating alone says which count (with a
    high ``cutoff``, the test that tells a misspelt key from a name of its own)."""
    word = str(word)
    low = word.lower()
    limit = max(1, len(word) // 4) if slips else -1
    ranked = []
    for choice in dict.fromkeys(str(c) for c in choices):
        typed: float = _slips(low, choice.lower())
        if typed == 1 and len(low) == len(choice) + 1 and _doubled(low, choice.lower()):
            typed = 0.5
        ratio = difflib.SequenceMatcher(None, word, choice).ratio()
        if typed <= limit or ratio >= cutoff:
            ranked.append((typed, abs(len(choice) - len(word)), -ratio, choice))
    return [c for *_, c in sorted(ranked)[:n]]


def did_you_mean(word: str, choices: Iterable[str], n: int = 3) -> str:
    """`` Did you mean 'a', 'b' or 'c'?`` for :func:`closest`, or an empty string."""
    close = [repr(c) for c in closest(word, choices, n)]
    if not close:
        return ""
    names = close[0] if len(close) == 1 else f"{', '.join(close[:-1])} or {close[-1]}"
    return f" Did you mean {names}?"


__all__ = ["closest", "did_you_mean"]
