"""``digit_version``: a version string as a comparable tuple of its first three numbers."""

import re


def digit_version(version: str) -> tuple[int, ...]:
    """``'2.13.0+cpu'`` → ``(2, 13, 0)``."""
    return tuple(int(x) for x in re.findall(r"\d+", version)[:3])
