"""MMEngine's runtime keys (what a ``default_runtime.py`` sets) translated to treadle's.

=================================  ==========================================================
MMEngine                           treadle
=================================  ==========================================================
``env_cfg.cudnn_benchmark``        true: ``RuntimeEnvHook(cudnn_benchmark=true)``, unless
                                   ``randomness.deterministic`` is true (MMEngine then turns
                                   it off again); false: dropped (torch's default)
``env_cfg.mp_cfg``                 ``RuntimeEnvHook`` ``mp_start_method``, ``opencv_num_threads``
``env_cfg.resource_limit``         ``RuntimeEnvHook`` ``open_files``
``env_cfg.dist_cfg.backend``       nccl or gloo: dropped (treadle starts nccl on CUDA, gloo
                                   on CPU: an MMEngine run on the other pairing would fail
                                   or only communicate more slowly)
``env_cfg.dist_cfg.timeout``       ``strategy: {type: ddp, timeout_s: ...}`` (merged into a
                                   ddp/fsdp strategy the config gives); 1800: dropped, the
                                   default of both
``log_level``                      ``RuntimeEnvHook(log_level=...)``; INFO: dropped
``visualizer``                     ``log_writers`` from its ``vis_backends``: LocalVisBackend
                                   -> jsonl, csv; TensorboardVisBackend -> tensorboard;
                                   WandbVisBackend -> ``{type: wandb, **init_kwargs}``;
                                   MLflowVisBackend -> ``{type: mlflow, experiment, run_name,
                                   tracking_uri, params}``. Its type (any ``*Visualizer``),
                                   ``name`` and drawing options: dropped (treadle draws no
                                   images, see the visualization hooks)
``launcher``                       none, pytorch, slurm, mpi: dropped (treadle finds how it
                                   was started: torchrun, SLURM, MPI or one process)
``log_processor``                  a LoggerHook with MMEngine's smoothing: ``window_size``
                                   (default 10; an int, ``epoch`` or ``global``) ->
                                   ``window``, ``by_epoch`` -> ``by_epoch`` (the console
                                   line's head), ``custom_cfg`` -> ``statistics``
                                   (``data_src`` -> ``key``, ``time`` as ``step_time``;
                                   ``log_name`` -> ``name``, ``method_name`` -> ``method``:
                                   mean, max, min, current; ``window_size`` -> ``window``),
                                   ``mean_pattern`` (default MMEngine's) -> ``mean_keys``;
                                   ``num_digits``: dropped (treadle prints 4 significant
                                   digits); ``log_with_hierarchy: true``: refused
``tta_model``, ``tta_pipeline``    dropped: read only by MMEngine's test-time augmentation
                                   (``tools/test.py --tta``), which treadle does not have
``*VisualizationHook``             off (no ``enable: true`` nor ``draw: true``): dropped
helper variables                   a top-level name that is no key of either, whose value
                                   is used inside another key (``data_root``,
                                   ``train_pipeline``, ``vis_backends``...): dropped
=================================  ==========================================================

Any other option or value is an error naming the key as the config wrote it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from treadle.components.errors import ConfigError, join_path
from treadle.openmmlab.common import take
from treadle.openmmlab.keys import RUNTIME_KEYS
from treadle.hooks.runtime_env import LOG_LEVELS, RuntimeEnvHook
from treadle.suggest import closest

#: Top-level runtime keys this module translates.

LAUNCHERS = ("none", "pytorch", "slurm", "mpi")
DEFAULT_TIMEOUT_S = 1800  # torch's process-group timeout, MMEngine's and treadle's default

_NO_IMAGES = "treadle draws no images; set it false (or remove the hook) to train without drawing"


@dataclass
class Runtime:
    """What the runtime keys translate to."""

    settings: list[tuple[str, Any, str]] = field(default_factory=list)  # (treadle key, value, source path)
    hooks: list[dict[str, Any]] = field(default_factory=list)
    strategy: dict[str, Any] = field(default_factory=dict)  # options for a ddp/fsdp strategy
    strategy_source: str = ""
    logger: dict[str, Any] = field(default_factory=dict)  # LoggerHook options (window, statistics, ...)


def _mapping(spec: Any, path: str, example: str) -> dict[str, Any]:
    if not isinstance(spec, dict):
        raise ConfigError(path, "must be a mapping", value=spec, expected=example)
    return spec


def _env_cfg(spec: Any, deterministic: bool, rt: Runtime, hook: dict[str, Any]) -> None:
    path = "env_cfg"
    env = take(_mapping(spec, path, "{cudnn_benchmark: false, mp_cfg: {...}, dist_cfg: {...}}"), path,
               {"cudnn_benchmark": "cudnn_benchmark", "mp_cfg": "mp_cfg", "dist_cfg": "dist_cfg",
                "resource_limit": "open_files"}, {})
    bench = env.get("cudnn_benchmark", False)
    if not isinstance(bench, bool):
        raise ConfigError(join_path(path, "cudnn_benchmark"), "not a bool", value=bench, expected="true or false")
    if bench and not deterministic:  # MMEngine's set_randomness(deterministic=True) turns it off after setup_env
        hook["cudnn_benchmark"] = True
    mp_path = join_path(path, "mp_cfg")
    mp = take(_mapping(env.get("mp_cfg", {}), mp_path, "{mp_start_method: fork, opencv_num_threads: 0}"), mp_path,
              {"mp_start_method": "mp_start_method", "opencv_num_threads": "opencv_num_threads"}, {})
    hook.update(mp)
    if "open_files" in env:
        hook["open_files"] = env["open_files"]
    _check_hook(hook, path)
    dist_path = join_path(path, "dist_cfg")
    dist = take(_mapping(env.get("dist_cfg", {}), dist_path, "{backend: nccl, timeout: 1800}"), dist_path,
                {"backend": "backend", "timeout": "timeout"}, {})
    if dist.get("backend", "nccl") not in ("nccl", "gloo"):
        raise ConfigError(join_path(dist_path, "backend"), "unsupported process-group backend", value=dist["backend"],
                          expected="nccl or gloo (treadle starts nccl on CUDA, gloo on CPU)")
    timeout = dist.get("timeout", DEFAULT_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ConfigError(join_path(dist_path, "timeout"), "not a positive number of seconds", value=timeout,
                          expected="e.g. 1800")
    if timeout != DEFAULT_TIMEOUT_S:
        rt.strategy["timeout_s"] = timeout
        rt.strategy_source = join_path(dist_path, "timeout")


def _check_hook(args: dict[str, Any], path: str) -> None:
    """The RuntimeEnvHook's own checks, with the error naming ``path``."""
    try:
        RuntimeEnvHook(**args)
    except (TypeError, ValueError) as e:
        raise ConfigError(path, str(e).replace("RuntimeEnvHook ", "")) from None


def _log_level(level: Any, hook: dict[str, Any]) -> None:
    if level not in LOG_LEVELS:
        raise ConfigError("log_level", "not a log level", value=level, expected=" or ".join(LOG_LEVELS))
    if level != "INFO":  # treadle logs at INFO
        hook["log_level"] = level


_LOCAL_FILES = "treadle's log file names are fixed (log.jsonl, log.csv, tensorboard/ in work_dir)"


def _backend(spec: Any, path: str) -> list[Any]:
    """The log writers for one of MMEngine's vis backends. Options left at None (their
    default) are dropped; any other value of an option treadle has not is an error."""
    spec = _mapping(spec, path, "{type: LocalVisBackend}")
    spec = {k: v for k, v in spec.items() if v is not None}
    kind = spec.get("type")
    if kind == "LocalVisBackend":
        take(spec, path, {}, {"type": None})
        return ["jsonl", "csv"]
    if kind == "TensorboardVisBackend":
        take(spec, path, {}, {"type": None})
        return ["tensorboard"]
    if kind == "WandbVisBackend":
        opts = take(spec, path, {"init_kwargs": "init_kwargs"}, {"type": None, "commit": True})
        init = _mapping(opts.get("init_kwargs", {}), join_path(path, "init_kwargs"), "{project: name, ...}")
        return [{"type": "wandb", **init}]
    if kind == "MLflowVisBackend":
        opts = take(spec, path, {"exp_name": "experiment", "run_name": "run_name", "tracking_uri": "tracking_uri",
                                 "params": "params"}, {"type": None})
        return [{"type": "mlflow", **opts}]
    raise ConfigError(join_path(path, "type"), "no treadle log writer for this backend", value=kind,
                      expected="LocalVisBackend, TensorboardVisBackend, WandbVisBackend or MLflowVisBackend "
                               "(or give a writer object in log_writers from Python)")


def _visualizer(spec: Any) -> list[Any]:
    path = "visualizer"
    spec = _mapping(spec, path, "{type: Visualizer, vis_backends: [{type: LocalVisBackend}]}")
    kind = spec.get("type", "Visualizer")
    if not isinstance(kind, str) or not kind.endswith("Visualizer"):
        raise ConfigError(join_path(path, "type"), "not a visualizer", value=kind,
                          expected="Visualizer or a project's *Visualizer (its vis_backends become log writers)")
    if "save_dir" in spec:
        raise ConfigError(join_path(path, "save_dir"), "option has no treadle equivalent", value=spec["save_dir"],
                          expected="no save_dir: " + _LOCAL_FILES)
    backends = spec.get("vis_backends") or []
    if not isinstance(backends, (list, tuple)):
        backends = [backends]
    writers: list[Any] = []
    for i, backend in enumerate(backends):
        for w in _backend(backend, join_path(join_path(path, "vis_backends"), i)):
            if w not in writers:
                writers.append(w)
    return writers


def _launcher(value: Any) -> None:
    if value not in LAUNCHERS:
        raise ConfigError("launcher", "unsupported launcher", value=value,
                          expected=f"one of {', '.join(LAUNCHERS)} (treadle finds how it was started itself)")


#: MMEngine's LogProcessor defaults: the keys it smooths, its window.
MMENGINE_MEAN_PATTERN = r".*(loss|time|data_time|grad_norm).*"
MMENGINE_WINDOW = 10
#: MMEngine's names of values treadle logs under another name.
_KEY_NAMES = {"time": "step_time"}
_METHODS = ("mean", "max", "min", "current")


def _window(value: Any, path: str) -> int | str | None:
    if value is None or value in ("epoch", "global"):
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(path, "not a window", value=value,
                          expected="an int >= 1 (the last that many values), 'epoch' or 'global'")
    return value


def _custom_cfg(spec: Any, path: str) -> list[dict[str, Any]]:
    """``custom_cfg`` entries as the LoggerHook's ``statistics``."""
    if not isinstance(spec, (list, tuple)):
        raise ConfigError(path, "must be a list", value=spec,
                          expected="[{data_src: loss, method_name: mean, window_size: global, log_name: ...}]")
    out = []
    for i, entry in enumerate(spec):
        where = join_path(path, i)
        entry = take(_mapping(entry, where, "{data_src: loss, method_name: mean, window_size: 100}"), where,
                     {"data_src": "key", "log_name": "name", "method_name": "method", "window_size": "window"}, {})
        if not isinstance(entry.get("key"), str):
            raise ConfigError(join_path(where, "data_src"), "missing or not a name", value=entry.get("key"),
                              expected="the logged value's name, e.g. loss")
        if entry.get("method", "mean") not in _METHODS:
            raise ConfigError(join_path(where, "method_name"), "no such statistic in treadle", value=entry["method"],
                              expected=", ".join(_METHODS) + " (a method registered with HistoryBuffer is not "
                                                             "available)")
        entry["window"] = _window(entry.get("window"), join_path(where, "window_size"))
        key = entry["key"]
        entry["key"] = _KEY_NAMES.get(key, key)
        entry.setdefault("name", _KEY_NAMES.get(key, key))
        out.append({k: v for k, v in entry.items() if v is not None})
    names = [e["name"] for e in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(path, "logs a name twice", value=twice, expected="each log_name (or data_src) once")
    return out


def _log_processor(spec: Any) -> dict[str, Any]:
    """The LoggerHook's options for MMEngine's smoothing (see the module's table)."""
    path = "log_processor"
    spec = _mapping(spec, path, "{window_size: 10, by_epoch: true}")
    opts = take(spec, path, {"window_size": "window", "by_epoch": "by_epoch", "custom_cfg": "statistics",
                             "mean_pattern": "mean_keys"},
                {"type": "LogProcessor", "num_digits": None, "log_with_hierarchy": False})
    window = _window(opts.get("window", MMENGINE_WINDOW), join_path(path, "window_size"))
    out: dict[str, Any] = {"window": "global" if window is None else window}  # None: MMEngine's mean of all kept
    by_epoch = opts.get("by_epoch", True)
    if not isinstance(by_epoch, bool):
        raise ConfigError(join_path(path, "by_epoch"), "not a bool", value=by_epoch, expected="true or false")
    out["by_epoch"] = by_epoch
    if opts.get("statistics"):
        out["statistics"] = _custom_cfg(opts["statistics"], join_path(path, "custom_cfg"))
    pattern = opts.get("mean_keys", MMENGINE_MEAN_PATTERN)
    if not isinstance(pattern, str):
        raise ConfigError(join_path(path, "mean_pattern"), "not a regular expression", value=pattern)
    out["mean_keys"] = pattern
    return out


def visualization_hook(spec: dict[str, Any], path: str) -> bool:
    """True for a downstream project's ``*VisualizationHook`` that is off (it is then
    dropped); an error for one that would draw; False for any other hook."""
    kind = spec.get("type")
    if not isinstance(kind, str) or not kind.endswith("VisualizationHook"):
        return False
    for key in ("enable", "draw"):
        if spec.get(key):
            raise ConfigError(join_path(path, key), "drawing is not supported", value=spec[key], hint=_NO_IMAGES)
    return True


def translate_runtime(cfg: dict[str, Any], *, deterministic: bool) -> Runtime:
    """The runtime keys of ``cfg`` (see the module's table)."""
    rt = Runtime()
    hook: dict[str, Any] = {}
    if "env_cfg" in cfg:
        _env_cfg(cfg["env_cfg"], deterministic, rt, hook)
    if "log_level" in cfg:
        _log_level(cfg["log_level"], hook)
    if hook:
        rt.hooks.append({"type": "RuntimeEnvHook", **hook})
    if "visualizer" in cfg and cfg["visualizer"] is not None:
        rt.settings.append(("log_writers", _visualizer(cfg["visualizer"]), "visualizer.vis_backends"))
    if "launcher" in cfg:
        _launcher(cfg["launcher"])
    if cfg.get("log_processor") is not None:
        rt.logger = _log_processor(cfg["log_processor"])
    return rt


def _plain(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _used_in(value: Any, where: Any) -> bool:
    """Whether ``value`` is ``where`` or inside it (a path also as the start of a string, as
    in ``data_root + 'train/'``)."""
    if where == value or (isinstance(value, str) and "/" in value and isinstance(where, str)
                          and where.startswith(value)):
        return True
    if isinstance(where, dict):
        return any(_used_in(value, v) for v in where.values())
    if isinstance(where, list):
        return any(_used_in(value, v) for v in where)
    return False


def helper_names(cfg: dict[str, Any], known: Iterable[str]) -> list[str]:
    """Top-level names of ``cfg`` that are helper variables: not in ``known`` (nor
    spelled close to a known key: a misspelt key stays an error), their value not a
    bool (too common to tell) and used inside another name's (``backend_args = None``
    counts when a None is: a None helper changes nothing)."""
    known = set(known)
    out = []
    for name, value in cfg.items():
        if name in known or isinstance(value, bool):
            continue
        if closest(name, known, n=1, cutoff=0.8, slips=False):
            continue
        value = _plain(value)
        if value in ("", [], {}):
            continue
        if any(_used_in(value, _plain(other)) for key, other in cfg.items() if key != name):
            out.append(name)
    return out


__all__ = ["LAUNCHERS", "RUNTIME_KEYS", "Runtime", "helper_names", "translate_runtime", "visualization_hook"]
