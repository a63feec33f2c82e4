"""The door for OpenMMLab projects: an MMEngine config, model, data and evaluator run on
treadle's engine as MMEngine's Runner runs them; ``from treadle.mmengine import Runner`` in
place of ``from mmengine.runner import Runner``.

    translate.py   MMEngine's engine keys -> treadle's (optim_wrapper, train_cfg, default_hooks, ...)
    keys.py        the top-level names of an MMEngine config (no torch: read before it is imported)
    optim.py, data.py, loop.py, checkpoint.py, runtime.py, strategy.py
                   the translation of one group of keys each (each module has its table)
    common.py      the translation's shared helper (``take``)
    scope.py       a project's registries (``default_scope``, ``custom_imports``)
    evaluator.py   ``val_evaluator`` / ``test_evaluator`` as MMEngine's loops run them
    hooks.py       a project's own hooks at treadle's points (hook_check.py, runner_view.py)
    runner.py      ``Runner``: MMEngine's Runner interface on treadle's Trainer

``mmengine`` itself is an optional dependency (``pip install 'treadle[mmengine]'``): the
translation needs none of it; a project's registries, models, datasets, evaluators and
hooks need it. ``docs/mmengine.md`` is the migration page.
"""

from typing import Any

from treadle.lazy import import_submodule


def __getattr__(name: str) -> Any:
    """``Runner`` (treadle/mmengine/runner.py), or a submodule, on first use."""
    if name == "Runner":
        from treadle.mmengine.runner import Runner

        return Runner
    return import_submodule(__name__, name)


__all__ = ["Runner"]
