"""Components from specs: ``{type: Name, **kwargs}`` made into the object it names.

Below the engine, which builds the config dicts of its own arguments with it, and below
the strategies (``strategy.prepare(dict(...))``); above the hooks, metrics, optimizers and
data it builds. The config files' face (reading, translating, checking a whole file,
building the Trainer) is treadle/config/, above the engine.

* :mod:`~treadle.components.registry`: ``type:`` names, one plain dict per kind;
* :mod:`~treadle.components.build`: models, loaders, hooks, losses and metrics from specs;
* :mod:`~treadle.components.hf_models`: Hugging Face models from ``config:``/``pretrained:``/``peft:``;
* :mod:`~treadle.components.empty_init`: a model's constructor recorded with its tensors left empty;
* :mod:`~treadle.components.keys`: checking a mapping's keys and value types;
* :mod:`~treadle.components.safe`: what ``safe=True`` allows;
* :mod:`~treadle.components.errors`: :class:`~treadle.components.errors.ConfigError`, one line naming the key.
"""

from typing import Any

from treadle.lazy import import_submodule


def __getattr__(name: str) -> Any:
    """A submodule on first use (``treadle.components.<module>`` after a bare ``import treadle``)."""
    return import_submodule(__name__, name)
