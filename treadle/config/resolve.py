"""From a config file to the resolved config: plain data, every Trainer key present,
checked against the schema. This is what ``config.yaml`` in a run directory holds.

    cfg = load_config("examples/digits/digits.yaml", ["optimizer.lr=0.01"], mode="train")
    save_config(cfg, "runs/x/config.yaml")   # load_config of that file gives cfg again
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

import yaml

from treadle.components.build import check_safe
from treadle.components.errors import ConfigError, did_you_mean, join_path
from treadle.config.loader import apply_overrides, blamed_on, has_variables, load_file
from treadle.openmmlab.translate import NOT_TRANSLATED, is_mmengine_style, translate
from treadle.config.origins import ResolvedConfig, in_user_terms, origins_of
from treadle.components.registry import name_of
from treadle.config.schema import PROJECT_KEYS, SCHEMA, check_value, required_keys, trainer_defaults
from treadle.config.unused import check_overrides, log_unused, split_unused
from treadle.openmmlab.scope import check_custom_imports

MODES = ("train", "validate", "test")

# Callables a Python config may give where the saved YAML holds a name.
_NAMED_KEYS = ("type", "collate_fn", "check_fn")


def to_plain(value: Any, path: str = "") -> Any:
    """Plain YAML data: tuples become lists, classes/functions under ``type`` (and
    ``collate_fn``, ``check_fn``, top-level ``loss_fn``) become their names; anything else
    that YAML cannot hold is an error naming the key."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ConfigError(join_path(path, k), "keys must be strings", value=k)
            p = join_path(path, k)
            named = k in _NAMED_KEYS or p == "loss_fn"
            out[k] = name_of(v) if named and callable(v) and not isinstance(v, str) else to_plain(v, p)
        return out
    if isinstance(value, (list, tuple)):
        return [to_plain(v, join_path(path, i)) for i, v in enumerate(value)]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise ConfigError(path, f"a {type(value).__name__} cannot be written into config.yaml", value=value,
                      expected="plain data (numbers, strings, lists, mappings) or a {type: Name, ...} spec")


def validate_config(cfg: dict[str, Any], mode: str | None = None) -> None:
    """Check keys, types, ranges, exclusive and required keys; raise the first problem.

    ``mode`` ("train", "validate", "test") adds the keys that command needs.
    """
    for key in cfg:
        if key not in SCHEMA:
            hint = NOT_TRANSLATED.get(key) or did_you_mean(key, SCHEMA) or "See docs/config.md for every key."
            raise ConfigError(key, "unknown key", value=cfg[key], expected="a treadle.Trainer argument", hint=hint)
    for key, value in cfg.items():
        check_value(SCHEMA[key], value, key)
    if cfg.get("max_epochs") is not None and cfg.get("max_iters") is not None:
        raise ConfigError("max_epochs, max_iters", "mutually exclusive",
                          value={"max_epochs": cfg["max_epochs"], "max_iters": cfg["max_iters"]},
                          expected="exactly one of them (set the other to null)")
    if cfg.get("workflow") and any(m == "val" for m, _ in cfg["workflow"]) and cfg.get("val_dataloader") is None \
            and mode == "train":
        raise ConfigError("workflow", "has a val phase but val_dataloader is not set", value=cfg["workflow"])
    for key in ("metrics", "train_metrics"):
        for name, spec in (cfg.get(key) or {}).items():
            if not isinstance(spec, (dict, str)):
                raise ConfigError(join_path(key, name), "not a component spec", value=spec, expected="{type: Accuracy}")
    if mode is None:
        return
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    for key, expected in required_keys(mode):
        if cfg.get(key) is None:
            raise ConfigError(key, f"missing required key for `treadle {mode}`", expected=expected)
    if mode == "train" and cfg.get("max_epochs") is None and cfg.get("max_iters") is None:
        raise ConfigError("max_epochs, max_iters", "missing required key for `treadle train`",
                          expected="max_epochs (epoch-based) or max_iters (iteration-based)")


def with_defaults(cfg: dict[str, Any]) -> dict[str, Any]:
    """Every Trainer key, in the signature's order, with the default where unset; then the
    project keys the config sets (:data:`~treadle.config.schema.PROJECT_KEYS`)."""
    out = {k: (cfg[k] if k in cfg else default) for k, default in trainer_defaults().items()}
    return {**out, **{k.name: cfg[k.name] for k in PROJECT_KEYS if cfg.get(k.name) is not None}}


def resolve_config(raw: dict[str, Any], overrides: Iterable[str] = (), *, mode: str | None = None,
                   source: str = "config", variables: bool = True, **values: Any) -> ResolvedConfig:
    """``raw`` (a loaded file) with ``--set`` overrides, MMEngine keys translated, then
    ``values`` (e.g. ``work_dir=...``; None values are ignored), made plain, checked and
    completed with defaults. Top-level names treadle does not take are left out and
    logged once (:mod:`treadle.config.unused`); ``source`` names the file there;
    ``variables=False`` (a YAML file) makes each such name an error. Errors
    name keys as the file wrote them (a translated key by its MMEngine path), and so does
    building the result (its ``origins``: :mod:`treadle.config.origins`)."""
    overrides = list(overrides)
    cfg = apply_overrides(raw, overrides)
    replaced: dict[str, str] = {}
    origins: dict[str, str] = {}
    if is_mmengine_style(cfg):
        cfg = translate(cfg, replaced, origins)
    given = {k: v for k, v in values.items() if v is not None}
    cfg.update(given)
    origins = {k: v for k, v in origins.items() if k.split(".", 1)[0].split("[", 1)[0] not in given}
    try:
        cfg, unused = split_unused(cfg, SCHEMA, NOT_TRANSLATED, variables=variables)
        check_overrides(overrides, unused, {k: v for k, v in replaced.items() if v})
        log_unused(sorted({*unused, *replaced}), source)
        cfg = to_plain(cfg)
        validate_config(cfg, mode)
    except ConfigError as e:
        renamed = in_user_terms(e, origins)
        if renamed is e:
            raise
        raise renamed from e
    return ResolvedConfig(with_defaults(cfg), origins)


def load_config(path: str | Path, overrides: Iterable[str] = (), *, mode: str | None = None, safe: bool = False,
                **values: Any) -> dict[str, Any]:
    """Read ``path`` (YAML or Python, with its ``_base_`` chain) and resolve it; every
    error is a :class:`ConfigError` attributed to the file.

    ``safe``: for configs from less trusted places (:mod:`treadle.components.safe`): ``.py``
    files and bases are refused before they run, and every name in the resolved config
    (``--set`` overrides included) must be registered or a torch.nn / torch.optim class.
    Build it with ``build_trainer(cfg, safe=True)`` too."""
    overrides = list(overrides)
    try:
        cfg = resolve_config(load_file(path, safe=safe), overrides, mode=mode, source=str(path),
                             variables=has_variables(path), **values)
        if safe:
            try:
                check_custom_imports(cfg.get("custom_imports"), safe=True)
                check_safe(cfg)
            except ConfigError as e:
                renamed = in_user_terms(e, origins_of(cfg))
                if renamed is e:
                    raise
                raise renamed from e
        return cfg
    except ConfigError as e:
        raise e.with_source(blamed_on(e.path, str(path), overrides)) from e.__cause__


def dump_config(cfg: dict[str, Any]) -> str:
    """The resolved config as YAML text (keys in schema order)."""
    return yaml.safe_dump(dict(cfg), sort_keys=False, default_flow_style=False, allow_unicode=True)


def config_text(cfg: dict[str, Any], path: str | Path) -> str:
    """The text of ``config.yaml`` at ``path``: a comment saying how to run it again, then
    the resolved config."""
    return "# resolved by treadle; run again with: treadle train " + str(path) + "\n" + dump_config(cfg)


def save_config(cfg: dict[str, Any], path: str | Path) -> Path:
    """Write the resolved config as YAML; ``treadle train`` of that file runs it again.
    (``treadle train`` itself hands the text to the Trainer, which writes it once the
    resume checks have passed: see ``Trainer.run_files``.)"""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(config_text(cfg, path), encoding="utf-8")
    os.replace(tmp, path)  # never a half-written config next to a run
    return path


__all__ = ["MODES", "config_text", "dump_config", "load_config", "resolve_config", "save_config", "to_plain", "validate_config",
           "with_defaults"]
