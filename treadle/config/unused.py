"""Top-level names of a config that treadle does not take: variables, not errors.

A config file's top-level names are variables, as in MMEngine, whose runner takes the
names it knows and ignores the rest: ``dataset_type``, ``train_pipeline``, ``norm_cfg``,
``backend_args``... are written for the project's own model and data. treadle leaves
them out of the resolved config and lists them once in the log ("not used: ...").

Three kinds stay errors, because ignoring them would hide a mistake:

* a name spelt close to a treadle key (``max_epoch``, ``log_intervl``): a typo, reported
  with its did-you-mean. A name whose value is used inside another key (a helper such
  as ``interval = 10`` then ``train_cfg = dict(val_interval=interval)``) must be closer
  still, since helpers are often named after the keys they feed. Beside the key it is
  near, which the config gives as well, a name is a variable when it holds that key's
  value or another key uses its value (``max_epoch = 20`` feeding ``train_cfg =
  dict(max_epochs=max_epoch)`` and a scheduler's ``end``);
* a name MMEngine's runner takes that treadle does not translate (``val_evaluator``,
  ``custom_imports``: :data:`treadle.openmmlab.translate.NOT_TRANSLATED`), with its hint;
* a name that a config may not choose (``safe``).

A YAML config has no variables: nothing in the file can use a name's value (YAML's
anchors are resolved as it is read). There, every top-level name must be a key (a treadle
key, or a key of MMEngine's runner that treadle translates), and any other name is an error
naming it and the keys close to it (``max_iterz`` -> ``max_iters``); a name that starts
with ``_`` is scratch (a place to hold an anchor) and left out. Only a Python config (and
MMEngine's Runner given a dict) has variables.

A ``--set`` of a name that nothing uses is an error too: the user asked for it.
"""

from __future__ import annotations

import os
from typing import Any, Iterable

from treadle.components.errors import ConfigError, did_you_mean
from treadle.suggest import closest

#: Names refused in a config, and why.
RESERVED = {"safe": "safe mode is chosen by whoever loads the config (treadle train --safe, load_config(safe=True)), "
                    "never by the config itself"}

_TYPO = 0.8  # difflib ratio from which a name reads as a misspelt key
_TYPO_OF_HELPER = 0.9  # the same for a name whose value another key uses


def _used_elsewhere(name: str, cfg: dict[str, Any], besides: tuple[str, ...] = ()) -> bool:
    value = cfg[name]
    return value not in (None, "", [], {}) and not isinstance(value, bool) and any(
        _contains(other, value) for key, other in cfg.items() if key != name and key not in besides)


def _contains(where: Any, value: Any) -> bool:
    if where == value:
        return True
    if isinstance(where, dict):
        return any(_contains(v, value) for v in where.values())
    if isinstance(where, (list, tuple)):
        return any(_contains(v, value) for v in where)
    return False


def misspelt(name: str, known: Iterable[str], cfg: dict[str, Any]) -> bool:
    """Whether ``name`` reads as a misspelling of one of ``known``."""
    helper = name in cfg and _used_elsewhere(name, cfg)
    known = list(known)
    if any(k.lower() == name.lower() for k in known):
        return True
    close = closest(name, known, n=1, cutoff=_TYPO_OF_HELPER if helper else _TYPO, slips=False)
    if not close or close[0] not in cfg:
        return bool(close)
    # The config gives the near key too. The name is a variable when leaving it out loses
    # nothing (it holds that key's value) or when another key uses its value: ``max_epoch =
    # 20`` feeding ``train_cfg = dict(max_epochs=max_epoch)`` and a scheduler's ``end``
    # (mmdet's grounding_dino), after ``--set train_cfg.max_epochs=1`` too. ``max_epoch =
    # 30`` beside ``max_epochs = 20``, used nowhere, stays a typo.
    return not (cfg[close[0]] == cfg.get(name) or _used_elsewhere(name, cfg, besides=(close[0],)))


def split_unused(cfg: dict[str, Any], known: Iterable[str], refused: dict[str, str], *,
                 variables: bool = True) -> tuple[dict[str, Any], list[str]]:
    """``cfg`` without the names treadle does not take, and those names. A misspelt key
    and a name of ``refused`` (name -> hint) or :data:`RESERVED` are errors; without
    ``variables`` (a YAML file), so is every name that is not a key."""
    known = list(known)
    keep: dict[str, Any] = {}
    unused: list[str] = []
    for name, value in cfg.items():
        if name in known:
            keep[name] = value
            continue
        hint = (refused.get(name) if value is not None else None) or RESERVED.get(name)  # None: nothing to translate
        if hint is None and (misspelt(name, known, cfg) or not (variables or name.startswith("_"))):
            hint = did_you_mean(name, known).strip() or None
            if hint is None and not variables:
                raise ConfigError(name, "unknown key (a YAML config has no variables)", value=value,
                                  expected="a treadle.Trainer argument (docs/config.md)")
        if hint:
            raise ConfigError(name, "unknown key", value=value, expected="a treadle.Trainer argument", hint=hint)
        unused.append(name)
    return keep, unused


def check_overrides(overrides: Iterable[str], unused: Iterable[str], replaced: dict[str, str]) -> None:
    """A ``--set`` must reach the run: not a name nothing uses, nor a variable whose key
    an MMEngine section sets (``replaced``: name -> that section, e.g. max_epochs -> train_cfg)."""
    unused = set(unused)
    for text in overrides:
        key = text.partition("=")[0].strip()
        top = key.replace("[", ".").split(".")[0]
        if top in replaced:
            raise ConfigError(f"--set {key}", f"{top} is a variable of this config: the run's {top} comes from "
                              f"{replaced[top]} (as MMEngine's runner reads it)",
                              expected=f"--set {replaced[top]}{key[len(top):]}=...")
        if top in unused:
            raise ConfigError(f"--set {key}", "no treadle key, and nothing in the config uses it",
                              expected="a treadle.Trainer argument or an MMEngine section (docs/config.md)")


def log_unused(names: list[str], source: str) -> None:
    """List the names once (by the first process under torchrun)."""
    if names and os.environ.get("RANK", "0") == "0":
        from treadle.logging.writers import get_logger

        get_logger().info("%s: not used (config variables that no treadle key takes): %s", source, ", ".join(names))


__all__ = ["RESERVED", "check_overrides", "log_unused", "misspelt", "split_unused"]
