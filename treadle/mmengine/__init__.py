"""MMEngine's ``Runner`` on treadle's engine: ``from treadle.mmengine import Runner`` in place of
``from mmengine.runner import Runner`` (:mod:`treadle.mmengine.runner`). The door it goes through,
MMEngine's keys translated and a project's registries, evaluators and hooks, is
:mod:`treadle.openmmlab`; ``docs/mmengine.md`` is the migration page."""

from typing import Any

from treadle.lazy import import_submodule


def __getattr__(name: str) -> Any:
    """``Runner`` (treadle/mmengine/runner.py), or a submodule, on first use."""
    if name == "Runner":
        from treadle.mmengine.runner import Runner

        return Runner
    return import_submodule(__name__, name)


__all__ = ["Runner"]
