"""Config files: a thin layer over the same constructors as plain Python.

    from treadle.config import load_config, build_trainer, save_config

    cfg = load_config("examples/digits/digits.yaml", ["max_epochs=1"], mode="train", work_dir="runs/d")
    trainer = build_trainer(cfg)          # every component built and checked; nothing written
    save_config(cfg, "runs/d/config.yaml")
    trainer.fit()

Modules, in the order a file goes through them:

* :mod:`~treadle.config.loader`: YAML (safe loader) / Python files, ``_base_``, ``--set``;
* :mod:`~treadle.openmmlab.translate`: MMEngine key names -> treadle's (a documented table);
* :mod:`~treadle.config.schema`: the table of Trainer keys, types and ranges;
* :mod:`~treadle.config.resolve`: plain data, checks, defaults: the resolved config;
* :mod:`~treadle.config.assemble`: the Trainer.

What turns one ``{type: Name, ...}`` into an object lives below the engine, which builds
the config dicts of its own arguments with it (treadle/components/): the ``type:`` names
(:mod:`~treadle.components.registry`), the builders (:mod:`~treadle.components.build`),
what ``safe=True`` allows (:mod:`~treadle.components.safe`), and :class:`ConfigError`.

Every problem is a :class:`ConfigError` naming the key path, the value and what was
expected, raised before training starts or anything is written. A config is trusted
like code: building it imports and calls the dotted ``type:`` paths it names, and
``.py`` configs run. ``load_config(..., safe=True)`` and ``build_trainer(cfg, safe=True)``
(``treadle train --safe``) run no code a config names: only registered names and
torch.nn / torch.optim classes, no ``.py`` files.
"""

import importlib
from typing import Any

# Where each public name lives (a module of this package, or of treadle.components below the
# engine). Imported on first use (PEP 562), so that importing one module of this package does
# not import the rest, which builds Trainers.
_WHERE = {
    "build_trainer": "assemble", "build_component": "treadle.components.build",
    "build_dataloader": "treadle.components.build", "build_hook": "treadle.components.build",
    "trainer_kwargs": "assemble", "ConfigError": "treadle.components.errors", "apply_overrides": "loader",
    "load_file": "loader", "merge": "loader", "parse_override": "loader", "is_mmengine_style": "treadle.openmmlab.translate",
    "translate": "treadle.openmmlab.translate", "DATASETS": "treadle.components.registry", "HOOKS": "treadle.components.registry",
    "LOSSES": "treadle.components.registry", "METRICS": "treadle.components.registry",
    "MODELS": "treadle.components.registry", "OPTIMIZERS": "treadle.components.registry",
    "REGISTRIES": "treadle.components.registry", "SCHEDULERS": "treadle.components.registry",
    "import_object": "treadle.components.registry", "resolve_type": "treadle.components.registry",
    "dump_config": "resolve", "load_config": "resolve", "resolve_config": "resolve", "save_config": "resolve",
    "validate_config": "resolve", "DATALOADER_KEYS": "schema", "SCHEMA": "schema", "TRAINER_KEYS": "schema",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:  # a submodule (treadle.config.resolve), imported on first use
        from treadle.lazy import import_submodule

        return import_submodule(__name__, name)
    where = _WHERE[name]
    value = getattr(importlib.import_module(where if "." in where else f"treadle.config.{where}"), name)
    globals()[name] = value
    return value


__all__ = [
    "ConfigError", "DATALOADER_KEYS", "DATASETS", "HOOKS", "LOSSES", "METRICS", "MODELS", "OPTIMIZERS", "REGISTRIES",
    "SCHEDULERS", "SCHEMA", "TRAINER_KEYS", "apply_overrides", "build_component", "build_dataloader", "build_hook",
    "build_trainer", "dump_config", "import_object", "is_mmengine_style", "load_config", "load_file", "merge",
    "parse_override", "resolve_type", "resolve_config", "save_config", "trainer_kwargs", "translate", "validate_config",
]
