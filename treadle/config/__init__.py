"""Config files: a thin layer over the same constructors as plain Python.

    from treadle.config import load_config, build_trainer, save_config

    cfg = load_config("examples/digits/digits.yaml", ["max_epochs=1"], mode="train", work_dir="runs/d")
    trainer = build_trainer(cfg)          # every component built and checked; nothing written
    save_config(cfg, "runs/d/config.yaml")
    trainer.fit()

Modules, in the order a file goes through them:

* :mod:`~treadle.config.loader`: YAML (safe loader) / Python files, ``_base_``, ``--set``;
* :mod:`~treadle.config.mmengine`: MMEngine key names -> treadle's (a documented table);
* :mod:`~treadle.config.schema`: the table of Trainer keys, types and ranges;
* :mod:`~treadle.config.resolve`: plain data, checks, defaults: the resolved config;
* :mod:`~treadle.config.registry`: ``type:`` names, one plain dict per kind;
* :mod:`~treadle.config.build`: components, the Trainer's arguments;
* :mod:`~treadle.config.assemble`: the Trainer;
* :mod:`~treadle.config.safe`: what ``safe=True`` allows.

Every problem is a :class:`ConfigError` naming the key path, the value and what was
expected, raised before training starts or anything is written. A config is trusted
like code: building it imports and calls the dotted ``type:`` paths it names, and
``.py`` configs run. ``load_config(..., safe=True)`` and ``build_trainer(cfg, safe=True)``
(``treadle train --safe``) run no code a config names: only registered names and
torch.nn / torch.optim classes, no ``.py`` files.
"""

from treadle.config.assemble import build_trainer
from treadle.config.build import build_component, build_dataloader, build_hook, trainer_kwargs
from treadle.config.errors import ConfigError
from treadle.config.loader import apply_overrides, load_file, merge, parse_override
from treadle.config.mmengine import is_mmengine_style, translate
from treadle.config.registry import (DATASETS, HOOKS, LOSSES, METRICS, MODELS, OPTIMIZERS, REGISTRIES, SCHEDULERS,
                                     import_object, resolve_type)
from treadle.config.resolve import dump_config, load_config, resolve_config, save_config, validate_config
from treadle.config.schema import DATALOADER_KEYS, SCHEMA, TRAINER_KEYS

__all__ = [
    "ConfigError", "DATALOADER_KEYS", "DATASETS", "HOOKS", "LOSSES", "METRICS", "MODELS", "OPTIMIZERS", "REGISTRIES",
    "SCHEDULERS", "SCHEMA", "TRAINER_KEYS", "apply_overrides", "build_component", "build_dataloader", "build_hook",
    "build_trainer", "dump_config", "import_object", "is_mmengine_style", "load_config", "load_file", "merge",
    "parse_override", "resolve_type", "resolve_config", "save_config", "trainer_kwargs", "translate", "validate_config",
]
