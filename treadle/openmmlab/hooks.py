"""An OpenMMLab project's own hooks (``custom_hooks: [{type: MyHook}]``, an ``mmengine.hooks.Hook``
subclass built by MMEngine's ``HOOKS`` registry) called at treadle's hook points.

:func:`adapt_hook` wraps one in a :class:`treadle.Hook` whose priority is the hook's number on
MMEngine's scale, which is treadle's (``HIGHEST`` 0, ``VERY_HIGH`` 10, ``HIGH`` 30, ``ABOVE_NORMAL``
40, ``NORMAL`` 50, ``BELOW_NORMAL`` 60, ``LOW`` 70, ``VERY_LOW`` 90, ``LOWEST`` 100; an int or an
``mmengine.runner.Priority`` as MMEngine reads it). The MMEngine points the hook's class overrides,
itself or through MMEngine's helpers (``_before_epoch``, ``_after_epoch``, ``_before_iter``,
``_after_iter``, which ``Hook``'s own points call), are called where MMEngine's Runner calls them,
with its keyword arguments; the adapter is a subclass made for the hook holding only the treadle
points those need, so treadle's dispatch never calls a point the hook does not use.

==========================  ====================================================================
MMEngine point              treadle's point, and what the hook gets
==========================  ====================================================================
``before_run``              ``before_run``, then a pending ``after_load_checkpoint`` (MMEngine
                            loads after ``before_run``; treadle resumes before it)
``after_load_checkpoint``   ``after_load_checkpoint`` inside a run, else after the next ``before_run``
``before_train_epoch``      by epoch: ``before_train_epoch``; by iteration once, after ``before_train``
``after_train_epoch``       by epoch: ``after_train_epoch``; by iteration once, before ``after_train``
                            (MMEngine's iteration loop is one epoch: ``epoch`` 0 of ``max_epochs`` 1)
``*_train_iter``            ``batch_idx``: the batch's place in the epoch (``state.inner_iter``); by
                            iteration ``state.iter``, as IterBasedTrainLoop; ``data_batch``, ``outputs``
``*_val_iter``,             ``batch_idx``: its place in the pass (counted here), ``data_batch``;
``*_test_iter``             ``outputs``: what treadle's evaluation step logs (an MMEngine model's
                            predictions go to the metrics only: ``{}``)
``after_val_epoch``,        ``metrics``: the pass's results under MMEngine's names (treadle's
``after_test_epoch``        ``val/accuracy/top1`` is ``accuracy/top1``)
``before_save_checkpoint``  ``checkpoint``: ``{meta: {epoch, iter, seed, experiment_name, ...}}``
others                      the point of the same name (``after_val`` without ``metrics``)
==========================  ====================================================================

**Checkpoints.** What the hook adds to ``checkpoint`` (and to its ``meta``) in
``before_save_checkpoint`` is this adapter's ``state_dict()`` (treadle saves each hook's state);
after a resume it is back in the ``checkpoint`` of ``after_load_checkpoint``, with a ``meta`` of the
epochs and iterations done. A hook that reads the message hub also has the hub's plain runtime info
kept (a best score, say), as MMEngine saves its hub. Values must be plain data or tensors
(checkpoints load with ``weights_only``); anything else fails the save, naming the key.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from treadle.components.errors import ConfigError, join_path
from treadle.hooks.base import Hook, HookStates
from treadle.openmmlab.hook_check import RESERVED_KEYS, check_hook, mm_hook, used_points
from treadle.openmmlab.runner_view import COUNTERS, RunnerView, plain
from treadle.openmmlab.mm import import_mmengine


class MMEngineHook(Hook):
    """Calls an MMEngine hook at treadle's points (see the module's docstring). Made by
    :func:`adapt_hook`, as a subclass holding only the points the hook uses."""

    mm_points: tuple[str, ...] = ()  # the MMEngine points forwarded
    reads_hub = False  # the hook reads runner.message_hub: its info is kept in checkpoints

    def __init__(self, hook: Any, path: str, priority: int) -> None:
        self.hook, self.path, self.priority = hook, path, priority
        self._call: dict[str, Callable[..., Any]] = {p: getattr(hook, p) for p in self.mm_points}
        self._view: RunnerView | None = None
        self._index = 0  # the batch in the running validation/test pass
        self._running = False  # between before_run and after_run
        self._pending: dict[str, Any] | None = None  # an after_load_checkpoint awaiting before_run
        self._stored: dict[str, Any] = {}  # what the hook added to the checkpoint at its last save
        self._hub_info: dict[str, Any] | None = None  # the hub's info, loaded, set at after_load_checkpoint

    def __repr__(self) -> str:
        return f"{type(self).__name__}({type(self.hook).__name__}, priority={self.priority!r})"

    def runner(self, trainer: Any) -> RunnerView:
        """The view of ``trainer`` (one per trainer, shared by its adapted hooks)."""
        view = self._view
        if view is None or view.trainer is not trainer:
            view = next((h._view for h in trainer.hooks if isinstance(h, MMEngineHook) and h._view is not None
                         and h._view.trainer is trainer), None) or RunnerView(trainer)
            self._view = view
        return view

    def _synced(self, trainer: Any, eval_done: bool = False) -> RunnerView:
        view = self.runner(trainer)
        view.sync(eval_done)
        return view

    def state_dict(self) -> dict[str, Any]:
        """The keys the hook added at its last save, and the hub's plain info (hooks reading it)."""
        state: dict[str, Any] = {"checkpoint": dict(self._stored)} if self._stored else {}
        if self.reads_hub and self._view is not None:
            info = self._view.message_hub.runtime_info
            state["hub_info"] = {k: v for k, v in info.items() if k not in COUNTERS and plain(v)}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._stored = dict(state.get("checkpoint") or {})
        self._hub_info = state.get("hub_info")


def _forward(point: str) -> Callable[..., None]:
    """A point forwarded with the runner alone."""
    def fn(self: MMEngineHook, trainer: Any, *args: Any) -> None:
        self._call[point](self._synced(trainer))

    return fn


def _before_run(self: MMEngineHook, trainer: Any) -> None:
    self._running = True
    view = self._synced(trainer)
    if "before_run" in self._call:
        self._call["before_run"](view)
    pending, self._pending = self._pending, None
    if pending is not None:
        self._call["after_load_checkpoint"](view, checkpoint=pending)


def _after_run(self: MMEngineHook, trainer: Any) -> None:
    self._running = False
    if "after_run" in self._call:
        self._call["after_run"](self._synced(trainer))


def _train_edge(point: str, epoch_point: str, first: bool) -> Callable[..., None]:
    """``before_train``/``after_train``; by iteration also the one epoch of MMEngine's loop."""
    def fn(self: MMEngineHook, trainer: Any) -> None:
        view = self._synced(trainer)
        calls = [point, epoch_point] if first else [epoch_point, point]
        for p in calls:
            if p in self._call and (p == point or not trainer.state.by_epoch):
                self._call[p](view)

    return fn


def _train_epoch(point: str) -> Callable[..., None]:
    def fn(self: MMEngineHook, trainer: Any) -> None:
        if trainer.state.by_epoch:
            self._call[point](self._synced(trainer))

    return fn


def _train_iter(point: str) -> Callable[..., None]:
    def fn(self: MMEngineHook, trainer: Any, batch: Any, outputs: Any = None) -> None:
        view, s = self._synced(trainer), trainer.state
        kwargs = {"outputs": outputs} if point.startswith("after") else {}
        self._call[point](view, batch_idx=s.inner_iter if s.by_epoch else s.iter, data_batch=batch, **kwargs)

    return fn


def _eval_epoch_start(point: str) -> Callable[..., None]:
    def fn(self: MMEngineHook, trainer: Any) -> None:
        self._index = 0
        if point in self._call:
            self._call[point](self._synced(trainer))

    return fn


def _eval_iter(point: str, mode: str) -> Callable[..., None]:
    after = point.startswith("after")

    def fn(self: MMEngineHook, trainer: Any, batch: Any, outputs: Any = None) -> None:
        index = self._index
        if after or f"after_{mode}_iter" not in self._call:  # the last call of the batch counts it
            self._index += 1
        kwargs = {"outputs": outputs} if after else {}
        self._call[point](self._synced(trainer), batch_idx=index, data_batch=batch, **kwargs)

    return fn


def _eval_end(point: str, mode: str) -> Callable[..., None]:
    def fn(self: MMEngineHook, trainer: Any, metrics: Mapping[str, Any]) -> None:
        view = self._synced(trainer, eval_done=not point.endswith("_epoch"))
        if point.endswith("_epoch"):
            results = view.results(mode, metrics)
            view.record(mode, results)
            if point in self._call:
                self._call[point](view, metrics=results)
        else:
            self._call[point](view)

    return fn


def _before_save_checkpoint(self: MMEngineHook, trainer: Any, checkpoint: dict[str, Any]) -> None:
    view = self._synced(trainer)
    meta = view.meta(checkpoint.get("loop"))
    mm = {"meta": dict(meta)}
    self._call["before_save_checkpoint"](view, checkpoint=mm)
    added = {k: v for k, v in mm.items() if k != "meta"}
    extra = {k: v for k, v in mm.get("meta", {}).items() if k not in meta or v is not meta[k]}
    if extra:
        added["meta"] = extra
    for key, value in added.items():
        if key in RESERVED_KEYS or not plain(value):
            why = "treadle's checkpointer owns" if key in RESERVED_KEYS else \
                "is not plain data or tensors (checkpoints load with weights_only)"
            raise ValueError(f"{self.path}: {type(self.hook).__name__}.before_save_checkpoint put "
                             f"checkpoint[{key!r}], which {why}; nothing was saved")
    self._stored = added
    keyed = HookStates(lambda: list(trainer.hooks)).keyed()  # the state was collected before this call
    key = next((k for k, h in keyed.items() if h is self), None)
    if key is not None and isinstance(checkpoint.get("hooks"), dict) and key in checkpoint["hooks"]:
        checkpoint["hooks"][key] = self.state_dict()


def _after_load_checkpoint(self: MMEngineHook, trainer: Any, checkpoint: dict[str, Any]) -> None:
    view = self.runner(trainer)
    if self._hub_info:
        view.message_hub.update_info_dict(self._hub_info)
        self._hub_info = None
    if "after_load_checkpoint" not in self._call:
        return
    stored = dict(self._stored)
    mm = {**stored, "meta": {**view.meta(checkpoint.get("loop")), **stored.get("meta", {})}}
    if self._running:
        self._call["after_load_checkpoint"](self._synced(trainer), checkpoint=mm)
    else:  # MMEngine loads after before_run: forwarded then
        self._pending = mm


def _methods(points: tuple[str, ...], reads_hub: bool) -> dict[str, Callable[..., None]]:
    """treadle's points the adapter needs for the MMEngine ``points`` forwarded."""
    used = set(points)
    out: dict[str, Callable[..., None]] = {}
    if used & {"before_run", "after_load_checkpoint"}:
        out["before_run"] = _before_run
    if used & {"after_run", "after_load_checkpoint"}:
        out["after_run"] = _after_run
    if used & {"before_train", "before_train_epoch"}:
        out["before_train"] = _train_edge("before_train", "before_train_epoch", first=True)
    if used & {"after_train", "after_train_epoch"}:
        out["after_train"] = _train_edge("after_train", "after_train_epoch", first=False)
    for point in ("before_train_epoch", "after_train_epoch"):
        if point in used:
            out[point] = _train_epoch(point)
    for point in ("before_train_iter", "after_train_iter"):
        if point in used:
            out[point] = _train_iter(point)
    for mode in ("val", "test"):
        iters = [p for p in (f"before_{mode}_iter", f"after_{mode}_iter") if p in used]
        if iters or f"before_{mode}_epoch" in used:
            out[f"before_{mode}_epoch"] = _eval_epoch_start(f"before_{mode}_epoch")
        for point in iters:
            out[point] = _eval_iter(point, mode)
        for point in (f"after_{mode}_epoch", f"after_{mode}"):
            if point in used or (reads_hub and point.endswith("_epoch")):
                out[point] = _eval_end(point, mode)
        if f"before_{mode}" in used:
            out[f"before_{mode}"] = _forward(f"before_{mode}")
    if "before_save_checkpoint" in used:
        out["before_save_checkpoint"] = _before_save_checkpoint
    if "after_load_checkpoint" in used or reads_hub:
        out["after_load_checkpoint"] = _after_load_checkpoint
    return out


def adapt_hook(hook: Any, path: str) -> Hook:
    """A treadle Hook calling MMEngine hook ``hook`` at its points (see the module's docstring);
    ``path`` names it in errors (``custom_hooks[0]``). Raises ConfigError when the hook reads what
    the runner view lacks, or edits the checkpoint entries treadle's checkpointer owns."""
    get_priority = import_mmengine("an MMEngine hook", "runner").get_priority

    cls = type(hook)
    if not isinstance(hook, mm_hook()):
        raise ConfigError(path, f"built a {cls.__name__}, not an mmengine.hooks.Hook")
    try:
        priority = get_priority(hook.priority)
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(join_path(path, "priority"), f"not an MMEngine priority ({type(e).__name__}: {e})",
                          value=hook.priority, expected="a name such as NORMAL or LOW, or an int in 0..100") from None
    use = check_hook(hook, path)
    points = used_points(cls)
    reads_hub = "message_hub" in use.reads
    methods = _methods(points, reads_hub)
    adapter = type(f"mmengine:{cls.__name__}", (MMEngineHook,),
                   {"mm_points": points, "reads_hub": reads_hub, "__module__": __name__, **methods})
    return adapter(hook, path, priority)




class RuntimeInfo(Hook):
    """MMEngine's current message hub kept up to date, as the Runner's RuntimeInfoHook keeps it:
    a project's models and transforms read ``MessageHub.get_current_instance().get_info('epoch')``
    (``iter``, ``max_epochs``, ``max_iters``) while they train (mmdet's TOOD head, YOLOX's random
    resize). Added for every config whose parts MMEngine's registries built; a few dictionary
    writes per iteration, no value read from the device (the hub's ``train/<loss>`` scalars,
    which cost a host read per step, are not kept)."""

    priority = "VERY_HIGH"  # before the hooks and the step that read it (MMEngine's is VERY_HIGH too)

    def __init__(self) -> None:
        self.hub = import_mmengine("MMEngine's message hub", "logging").MessageHub.get_current_instance()

    def _update(self, trainer: Any) -> None:
        hub, state = self.hub, trainer.state
        hub.update_info("epoch", state.epoch if state.by_epoch else 0)
        hub.update_info("iter", state.iter)
        hub.update_info("max_epochs", (state.max_epochs or 0) if state.by_epoch else 1)
        hub.update_info("max_iters", state.max_iters or 0)

    def before_train(self, trainer: Any) -> None:
        self._update(trainer)

    def before_train_epoch(self, trainer: Any) -> None:
        self._update(trainer)

    def before_train_iter(self, trainer: Any, batch: Any) -> None:
        self.hub.update_info("iter", trainer.state.iter)


__all__ = ["MMEngineHook", "RuntimeInfo", "adapt_hook"]
