"""Building the Trainer from a resolved config: :mod:`treadle.config.build` builds its
arguments, this module the ``treadle.Trainer``. It is apart from build.py, which the
Trainer (and the strategies) use to build the config dicts they are given, so that
build.py never imports the Trainer.
"""

from __future__ import annotations

import re
from typing import Any

from treadle.checkpoint.manifest import CheckpointError
from treadle.config.build import trainer_kwargs
from treadle.config.errors import ConfigError
from treadle.config.schema import SCHEMA
from treadle.engine.trainer import Trainer


def _explain(err: Exception, cfg: dict[str, Any]) -> ConfigError:
    """A Trainer check's error as a ConfigError. Its messages start with the argument's
    name, which becomes the key path; the scheduler builder's ``param_scheduler[i]``
    is the config's ``schedulers[i]``."""
    # str() of a KeyError is the repr of its message (quoted); any other message is kept as it is.
    text = err.args[0] if isinstance(err, KeyError) and len(err.args) == 1 and isinstance(err.args[0], str) else str(err)
    if isinstance(cfg.get("schedulers"), list):
        text = text.replace("param_scheduler[", "schedulers[")
    first = re.match(r"[A-Za-z_]+", text)
    if first and (first.group(0) in SCHEMA or first.group(0) == "param_scheduler"):
        return ConfigError("", text)  # starts with the key path already
    return ConfigError("", f"{type(err).__name__}: {text}")


def build_trainer(cfg: dict[str, Any], mode: str = "train", *, safe: bool = False, **overrides: Any) -> Any:
    """Build every component and the ``treadle.Trainer``; nothing is written yet (the
    Trainer creates ``work_dir`` in fit/validate/test). ``overrides`` replace Trainer
    arguments after the build (e.g. ``load_from=`` for ``treadle validate``). ``safe``:
    only registered names and torch classes (:mod:`treadle.config.safe`), for the
    Trainer's own optimizer build too."""
    kw = trainer_kwargs(cfg, mode, safe=safe)
    kw.update(overrides)
    try:
        return Trainer(**kw, safe=safe)
    except (ConfigError, CheckpointError):  # a checkpoint that does not load is not a config error
        raise
    except (ValueError, TypeError, KeyError, FileNotFoundError, NotImplementedError, RuntimeError) as e:
        raise _explain(e, cfg) from e


__all__ = ["build_trainer"]
