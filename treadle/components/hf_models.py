"""Hugging Face models from config files: ``{type: transformers.X, config: {...}}`` or
``{type: transformers.X, pretrained: PATH}``.

A transformers model class takes a config *object*, which a YAML file cannot write; so a
model spec whose ``type`` is a transformers model class (a ``PreTrainedModel`` subclass or an
``AutoModel*`` class) is built here instead of by calling the class with the spec's keys:

* ``config: {hidden_size: 32, ...}``: the config class's arguments (the model class's
  ``config_class``; for an ``AutoModel*`` class the ``model_type`` key names it, e.g.
  ``model_type: bert``), each checked against that class (a misspelt key is an error, where
  transformers would keep it as an attribute silently); the model is built from the config,
  with fresh weights (``X(config)``; ``AutoModel*.from_config(config)``);
* ``pretrained: PATH``: a local directory written by ``save_pretrained`` (or a file a hub
  download left): ``X.from_pretrained(PATH, local_files_only=True, weights_only=True)``, so
  nothing is downloaded and the weights are read without running code from them; remote code
  is never trusted. ``config:`` beside it overrides the saved config's values;
* ``peft: {peft_type: LORA, r: 8, target_modules: [q_proj, v_proj], ...}`` (beside either):
  the built model wrapped by ``peft.get_peft_model`` with that adapter, its keys the
  arguments of peft's own config class for ``peft_type`` (``LoraConfig``, ``IA3Config``,
  ``LoHaConfig``, ...), each checked against it; ``peft: ADAPTER_DIR``: a saved adapter
  (``save_pretrained``'s folder) on the built model, trainable
  (``PeftModel.from_pretrained(model, ADAPTER_DIR, is_trainable=True)``; safetensors, or
  ``torch.load`` with ``weights_only``). peft is imported only then.

Errors are one :class:`~treadle.components.errors.ConfigError` naming ``model.config.<key>``,
``model.pretrained``, ``model.peft.<key>`` or ``model``. The ``type`` itself is resolved as any dotted type is, so
``safe=True`` refuses it before transformers is imported (:mod:`treadle.components.safe`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import warnings
from pathlib import Path
from typing import Any, Iterator, Mapping

from torch import nn

from treadle.components.errors import ConfigError, did_you_mean, join_path

#: The keys of a transformers model spec besides ``type``.
KEYS = ("config", "pretrained", "peft")


def is_hf_model_class(obj: Any) -> bool:
    """A transformers model class: defined in ``transformers``, with ``from_pretrained``
    and either a ``config_class`` (a ``PreTrainedModel``) or ``from_config`` (``AutoModel*``)."""
    module = getattr(obj, "__module__", "") or ""
    return (inspect.isclass(obj) and module.split(".", 1)[0] == "transformers"
            and callable(getattr(obj, "from_pretrained", None))
            and (getattr(obj, "config_class", None) is not None or callable(getattr(obj, "from_config", None))))


def _is_auto(cls: type) -> bool:
    return getattr(cls, "config_class", None) is None


def _check_keys(config_cls: type, default: Any, values: Mapping[str, Any], path: str) -> None:
    """Every key an argument of ``config_cls`` or an attribute of its default instance."""
    try:
        params = {p for p in inspect.signature(config_cls.__init__).parameters if p != "self"}
    except (TypeError, ValueError):
        params = set()
    for key, value in values.items():
        if key in params or hasattr(default, key):
            continue
        known = sorted(params | {k for k in vars(default) if not k.startswith("_")})
        raise ConfigError(join_path(path, key), f"unknown argument for {config_cls.__name__}", value=value,
                          expected=f"arguments among {', '.join(known[:25])}{', ...' if len(known) > 25 else ''}",
                          hint=did_you_mean(key, known))


def _config(cls: type, values: Any, path: str) -> Any:
    """The config object ``values`` (a mapping of the config class's arguments) describes."""
    if not isinstance(values, Mapping):
        raise ConfigError(path, "not a mapping of the config's arguments", value=values,
                          expected="e.g. {hidden_size: 32, num_hidden_layers: 2, ...}")
    values = dict(values)
    if _is_auto(cls):
        from transformers import AutoConfig

        model_type = values.pop("model_type", None)
        if not isinstance(model_type, str):
            raise ConfigError(join_path(path, "model_type"), f"{cls.__name__} needs the model type to choose a config "
                              "class", value=model_type, expected="e.g. model_type: bert")
        try:
            default = AutoConfig.for_model(model_type)
        except ValueError as e:
            raise ConfigError(join_path(path, "model_type"), f"not a transformers model type ({e})".split("\n")[0],
                              value=model_type) from None
        config_cls = type(default)
    else:
        config_cls = cls.config_class  # type: ignore[attr-defined]  # is_hf_model_class checked it
        default = config_cls()
    _check_keys(config_cls, default, values, path)
    try:
        return config_cls(**values)
    except Exception as e:
        raise ConfigError(path, f"{config_cls.__name__}(...) failed: {type(e).__name__}: {e}".split("\n")[0]) from e


def build_hf_model(cls: type, spec: Mapping[str, Any], path: str = "model") -> nn.Module:
    """The model ``{type: cls, config: ..., pretrained: ...}`` describes (see the module's docstring)."""
    unknown = [k for k in spec if k not in (*KEYS, "type")]
    if unknown:
        raise ConfigError(join_path(path, unknown[0]), f"not a key of a transformers model spec ({cls.__name__})",
                          value=spec[unknown[0]], expected="config: {the config's arguments} and/or pretrained: PATH "
                          "(and peft: {an adapter's arguments} or peft: ADAPTER_DIR)",
                          hint=did_you_mean(unknown[0], KEYS))
    pretrained, values = spec.get("pretrained"), spec.get("config")
    if pretrained is None and values is None:
        raise ConfigError(path, f"a transformers model ({cls.__name__}) needs config: {{...}} (fresh weights) or "
                          "pretrained: PATH (weights saved with save_pretrained)")
    if pretrained is None:
        config = _config(cls, values, join_path(path, "config"))
        try:
            model = cls.from_config(config) if _is_auto(cls) else cls(config)  # type: ignore[attr-defined]  # an AutoModel class has from_config
        except Exception as e:
            raise ConfigError(path, f"{cls.__name__} from its config failed: {type(e).__name__}: {e}".split("\n")[0]) from e
    else:
        from treadle.components.empty_init import recording

        # On the meta device (a sharding strategy builds it): the saved config's skeleton now,
        # the weights read shard by shard when it is materialized.
        model = (_skeleton(cls, pretrained, values, path) if recording()
                 else _from_pretrained(cls, pretrained, values, path))
    if not isinstance(model, nn.Module):
        raise ConfigError(path, f"{cls.__name__} built a {type(model).__name__}, not a torch.nn.Module")
    if spec.get("peft") is not None:
        model = apply_peft(model, spec["peft"], join_path(path, "peft"))
    return model


def _pretrained_args(pretrained: Any, values: Any, path: str) -> dict[str, Any]:
    """The config overrides beside ``pretrained:``, once the path is checked."""
    where = join_path(path, "pretrained")
    if not isinstance(pretrained, str) or not pretrained:
        raise ConfigError(where, "not a path", value=pretrained, expected="a directory written by save_pretrained")
    if not Path(pretrained).exists():
        raise ConfigError(where, "no such local file or directory", value=pretrained,
                          expected="a directory written by save_pretrained",
                          hint="treadle downloads nothing: fetch a hub model first (e.g. huggingface-cli download "
                               "NAME --local-dir DIR) and give DIR.")
    if values is not None and not isinstance(values, Mapping):
        raise ConfigError(join_path(path, "config"), "not a mapping of the config's arguments", value=values)
    return dict(values or {})


def _skeleton(cls: type, pretrained: Any, values: Any, path: str) -> nn.Module:
    """The model ``from_pretrained`` would build (its saved config, with the overrides;
    the dtype it gives), with every weight on the meta device: its weights are named for
    materialization (treadle/components/empty_init.py), which reads each process's share."""
    from transformers import AutoConfig, GenerationConfig

    from treadle.checkpoint.tensor_sources import SAFE_INDEX, SAFE_WEIGHTS, is_hf_folder
    from treadle.components.empty_init import from_weights

    overrides = _pretrained_args(pretrained, values, path)
    where = join_path(path, "pretrained")
    folder = Path(pretrained)
    if folder.is_dir() and not is_hf_folder(folder):
        raise ConfigError(where, f"no {SAFE_WEIGHTS} or {SAFE_INDEX} in the folder", value=pretrained,
                          expected="a folder written by save_pretrained with safetensors weights (the weights are "
                                   "then read shard by shard)")
    auto = _is_auto(cls)
    try:
        reader = AutoConfig if auto else cls.config_class  # type: ignore[attr-defined]  # is_hf_model_class checked it
        config = reader.from_pretrained(pretrained, local_files_only=True, **({"trust_remote_code": False} if auto else {}),
                                        **overrides)
        config.name_or_path = pretrained  # as from_pretrained sets it (an export finds the base there)
        with from_weights(pretrained):  # the constructor's draws are not made: the weights replace them
            model = cls.from_config(config) if auto else cls._from_config(config)  # type: ignore[attr-defined]  # the dtype from_pretrained gives
    except Exception as e:
        first = str(e).strip().split("\n")[0]
        raise ConfigError(where, f"{cls.__name__} from its saved config failed: {type(e).__name__}: {first}",
                          value=pretrained) from e
    if (folder / "generation_config.json").is_file() and getattr(model, "generation_config", None) is not None:
        model.generation_config = GenerationConfig.from_pretrained(pretrained, local_files_only=True)
    return model.eval()  # as from_pretrained returns it


@contextlib.contextmanager
def _said_by_rank_0() -> Iterator[None]:
    """transformers' own lines while it loads a folder (its progress bar, its load report
    of missing and unexpected keys) on rank 0 only: every rank of a job loads the same
    folder, and would print the same lines."""
    from treadle.distributed.voice import job_rank

    if job_rank() == 0:
        yield
        return
    from transformers.utils import logging as hf_logging

    level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def _from_pretrained(cls: type, pretrained: Any, values: Any, path: str) -> nn.Module:
    where = join_path(path, "pretrained")
    overrides = _pretrained_args(pretrained, values, path)
    extra = {"trust_remote_code": False} if _is_auto(cls) else {}
    try:
        with _said_by_rank_0():
            return cls.from_pretrained(pretrained, local_files_only=True, weights_only=True, **extra, **overrides)  # type: ignore[attr-defined]  # is_hf_model_class checked it
    except Exception as e:
        first = str(e).strip().split("\n")[0]
        raise ConfigError(where, f"{cls.__name__}.from_pretrained failed: {type(e).__name__}: {first}",
                          value=pretrained) from e


def apply_peft(model: nn.Module, spec: Any, path: str = "model.peft") -> nn.Module:
    """``model`` with a PEFT adapter: ``spec`` is a mapping with ``peft_type`` (``LORA``,
    ``IA3``, ``LOHA``, ...) and that type's config arguments, checked against peft's config
    class (``model.peft.<key>`` names a wrong one), or a directory written by a PEFT
    model's ``save_pretrained`` (the adapter loaded trainable). Only the adapter trains:
    the base's parameters are frozen, which checkpoints then leave out
    (treadle/checkpoint/frozen.py)."""
    try:
        import peft
    except ImportError:
        raise ConfigError(path, "needs the peft package", hint="pip install peft (treadle's hf extra has it)") from None
    if isinstance(spec, (str, os.PathLike)):
        return _saved_adapter(peft, model, spec, path)
    if not isinstance(spec, Mapping):
        raise ConfigError(path, "not an adapter's config nor a path", value=spec,
                          expected="{peft_type: LORA, r: 8, target_modules: [...], ...} or a directory written by "
                                   "save_pretrained (adapter_config.json)")
    from peft.mapping import PEFT_TYPE_TO_CONFIG_MAPPING

    values = dict(spec)
    kind = values.pop("peft_type", None)
    types = sorted(str(t.value) for t in PEFT_TYPE_TO_CONFIG_MAPPING)
    if kind is None:
        raise ConfigError(join_path(path, "peft_type"), "missing required key", expected=f"one of {', '.join(types)}")
    if not isinstance(kind, str) or kind.upper() not in types:
        raise ConfigError(join_path(path, "peft_type"), "not a PEFT adapter type", value=kind,
                          expected=f"one of {', '.join(types)}",
                          hint=did_you_mean(kind.upper(), types) if isinstance(kind, str) else "")
    config_cls = PEFT_TYPE_TO_CONFIG_MAPPING[peft.PeftType(kind.upper())]
    fields = [f.name for f in dataclasses.fields(config_cls) if f.init and f.name != "peft_type"]
    for key, value in values.items():
        if key not in fields:
            raise ConfigError(join_path(path, key), f"unknown argument for {config_cls.__name__}", value=value,
                              expected=f"arguments among {', '.join(fields[:25])}{', ...' if len(fields) > 25 else ''}",
                              hint=did_you_mean(key, fields))
    try:
        config = config_cls(**values)
    except Exception as e:
        raise ConfigError(path, f"{config_cls.__name__}(...) failed: {type(e).__name__}: {e}".split("\n")[0]) from e
    try:
        with _quiet_peft():
            return peft.get_peft_model(model, config)
    except Exception as e:
        where = join_path(path, "target_modules") if "target modules" in str(e).lower() else path
        raise ConfigError(where, f"peft.get_peft_model with {config_cls.__name__} failed: {type(e).__name__}: "
                          f"{e}".split("\n")[0]) from e


def _saved_adapter(peft: Any, model: nn.Module, directory: str | os.PathLike[str], path: str) -> nn.Module:
    """The adapter saved in ``directory`` on ``model``, trainable; nothing is downloaded."""
    if not (Path(directory) / "adapter_config.json").is_file():
        raise ConfigError(path, "not a saved adapter (no adapter_config.json there)", value=str(directory),
                          expected="a directory written by a PEFT model's save_pretrained",
                          hint="treadle downloads nothing: fetch an adapter first and give its directory.")
    try:
        with _quiet_peft():
            return peft.PeftModel.from_pretrained(model, str(directory), is_trainable=True, local_files_only=True)
    except Exception as e:
        raise ConfigError(path, f"PeftModel.from_pretrained failed: {type(e).__name__}: {e}".split("\n")[0],
                          value=str(directory)) from e


@contextlib.contextmanager
def _quiet_peft() -> Iterator[None]:
    """peft asks a transformers model ``is_gradient_checkpointing``, which transformers 5
    deprecates with a FutureWarning the user can do nothing about: that one is dropped."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        yield


__all__ = ["KEYS", "apply_peft", "build_hf_model", "is_hf_model_class"]
