"""Errors in the user's own words: a key of a translated config named as the file wrote it.

An MMEngine config is translated to treadle's keys before it is checked and built
(:mod:`treadle.openmmlab.translate`): its ``custom_hooks[1]`` becomes ``hooks[2]``, its
``param_scheduler`` ``schedulers``, its ``default_hooks.checkpoint.save_best``
``checkpoint.best``. The translation records, for each key path it wrote, the path the file
wrote (``origins``); the resolved config carries them (:class:`ResolvedConfig`), and every
error found while checking or building it is told under the file's path
(:func:`in_user_terms`). A config written with treadle's keys has no origins: its paths are
the file's already.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from treadle.components.errors import ConfigError

#: A key path at the start of a message (``hooks[1].patience``, ``schedulers.gen[0]``), and the
#: option named after it in the messages of the Trainer's dict arguments (``checkpoint keep must ...``,
#: ``checkpoint best='x' is ...``).
_LEADING_PATH = re.compile(r"(?P<path>[A-Za-z_]\w*(?:\.\w+|\[\d+\])*)(?: (?P<option>\w+)(?=[= ]))?")


class ResolvedConfig(dict):  # type: ignore[type-arg]  # a dict of plain data, as config.yaml holds it
    """A resolved config: a plain ``dict`` of treadle keys, plus ``origins``, the key paths the
    config file wrote for the paths that a translation renamed (``{"hooks[2]":
    "custom_hooks[1]"}``). Copies made with ``copy.deepcopy`` keep them; ``dict(cfg)`` does not."""

    def __init__(self, data: Mapping[str, Any] = (), origins: Mapping[str, str] | None = None) -> None:
        super().__init__(data)
        self.origins: dict[str, str] = dict(origins or {})


def origins_of(cfg: Any) -> dict[str, str]:
    """The origins a resolved config carries (``{}`` for a plain dict)."""
    return dict(getattr(cfg, "origins", None) or {})


def user_path(path: str, origins: Mapping[str, str]) -> str:
    """``path`` as the config file wrote it: the longest recorded path that ``path`` is or
    starts with (followed by ``.`` or ``[``) replaced by its origin."""
    best = ""
    for internal in origins:
        if len(internal) > len(best) and (path == internal or path.startswith((internal + ".", internal + "["))):
            best = internal
    return origins[best] + path[len(best):] if best else path


def in_user_terms(err: ConfigError, origins: Mapping[str, str]) -> ConfigError:
    """``err`` with its key path (or, for an error without one, the key path its message
    starts with) as the config file wrote it; ``err`` itself when nothing changes."""
    if not origins:
        return err
    if err.path:
        path = user_path(err.path, origins)
        return err if path == err.path else err.at(path)
    match = _LEADING_PATH.match(err.problem)
    if match is None:
        return err
    internal, end = match.group("path"), match.end("path")
    option = match.group("option")
    if option is not None and f"{internal}.{option}" in origins:  # "checkpoint keep ..." -> "<file's path of keep> ..."
        internal, end = f"{internal}.{option}", match.end("option")
    path = user_path(internal, origins)
    return err if path == internal else err.at("", path + err.problem[end:])


__all__ = ["ResolvedConfig", "in_user_terms", "origins_of", "user_path"]
