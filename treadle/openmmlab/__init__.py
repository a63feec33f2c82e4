"""The door for OpenMMLab projects, below the config layer: an MMEngine config, its registries,
model, data, evaluators and hooks on treadle's engine, as MMEngine's Runner runs them.

    translate.py   MMEngine's engine keys -> treadle's (optim_wrapper, train_cfg, default_hooks, ...)
    keys.py        the top-level names of an MMEngine config (no torch: read before it is imported)
    optim.py, data.py, loop.py, checkpoint.py, runtime.py, strategy.py
                   the translation of one group of keys each (each module has its table)
    common.py      the translation's shared helper (``take``)
    mm.py          MMEngine itself, imported where it is needed (the one line naming the extra)
    scope.py       a project's registries (``default_scope``, ``custom_imports``)
    evaluator.py   ``val_evaluator`` / ``test_evaluator`` as MMEngine's loops run them
    hooks.py       a project's own hooks at treadle's points (hook_check.py, runner_view.py)

``mmengine`` itself is an optional dependency (``pip install 'treadle[mmengine]'``): the
translation needs none of it; a project's registries, models, datasets, evaluators and hooks
need it. :mod:`treadle.config` reads config files with it; :mod:`treadle.mmengine` is MMEngine's
``Runner`` interface above both. ``docs/mmengine.md`` is the migration page.
"""

from typing import Any

from treadle.lazy import import_submodule


def __getattr__(name: str) -> Any:
    """A submodule on first use (``treadle.openmmlab.<module>`` after a bare ``import treadle``)."""
    return import_submodule(__name__, name)
