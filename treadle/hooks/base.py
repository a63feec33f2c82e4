"""The Hook base class, priorities, and the dispatch table the Trainer calls through.

A hook overrides any of the points in :data:`HOOK_POINTS`. The Trainer builds one
tuple of bound methods per point, once, from the hooks that really override it, so a
point that no hook implements costs an empty-tuple check and nothing more.
"""

from __future__ import annotations

import inspect
from enum import IntEnum
from typing import TYPE_CHECKING, Any, Callable, Iterable

from treadle.suggest import closest

if TYPE_CHECKING:
    from treadle.hooks.view import RunView


class Priority(IntEnum):
    """Named priorities; a lower number runs first (MMEngine's scale)."""

    HIGHEST = 0
    VERY_HIGH = 10
    HIGH = 30
    ABOVE_NORMAL = 40
    NORMAL = 50
    BELOW_NORMAL = 60
    LOW = 70
    VERY_LOW = 90
    LOWEST = 100


def get_priority(priority: int | str | Priority) -> int:
    """Turn a priority name or number into an int in [0, 100]."""
    if isinstance(priority, str):
        try:
            return int(Priority[priority.upper()])
        except KeyError:
            names = ", ".join(p.name for p in Priority)
            raise ValueError(f"unknown hook priority {priority!r}; expected one of {names} or an int in 0..100") from None
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise TypeError(f"hook priority must be an int in 0..100 or a name, got {priority!r}")
    if not 0 <= priority <= 100:
        raise ValueError(f"hook priority must be in 0..100, got {priority}")
    return int(priority)


# Every hook point, with the arguments each receives after the trainer.
HOOK_POINTS: dict[str, tuple[str, ...]] = {
    "before_run": (),
    "after_run": (),
    "before_train": (),
    "after_train": (),
    "before_train_epoch": (),
    "after_train_epoch": (),
    "before_train_iter": ("batch",),
    "after_train_iter": ("batch", "outputs"),
    "after_backward": (),
    "before_optimizer_step": (),
    "before_val": (),
    "after_val": ("metrics",),
    "before_val_epoch": (),
    "after_val_epoch": ("metrics",),
    "before_val_iter": ("batch",),
    "after_val_iter": ("batch", "outputs"),
    "before_test": (),
    "after_test": ("metrics",),
    "before_test_epoch": (),
    "after_test_epoch": ("metrics",),
    "before_test_iter": ("batch",),
    "after_test_iter": ("batch", "outputs"),
    "before_save_checkpoint": ("checkpoint",),
    "after_load_checkpoint": ("checkpoint",),
}


class Hook:
    """Base class for hooks. Override only the points you need.

    The order of calls in ``trainer.fit()`` (see ``treadle/engine/loops.py``)::

        before_run
        before_train
          before_train_epoch                      # each epoch
            before_train_iter(batch)              # each iteration
              after_backward                      #   inside the optimizer update
              before_optimizer_step               #   only on iterations that step
            after_train_iter(batch, outputs)
          after_train_epoch
          before_val / before_val_epoch / (before_val_iter, after_val_iter)* /
            after_val_epoch(metrics) / after_val(metrics)   # every val_interval
        after_train
        after_run

    ``validate()`` and ``test()`` run ``before_run``, the matching val/test points,
    and ``after_run``. ``outputs`` is the dict the step returned (detached losses).

    A hook whose ``after_train_iter`` acts only at some iterations (a log interval)
    can say which with :meth:`next_train_iter`; the loop then calls it at those
    iterations only (with every other hook of the point, in order), and per iteration
    it costs nothing. It reads the values of the iterations in between from
    ``trainer.store``, where the loop records each step's outputs and times.

    Attributes:
        priority: int in 0..100 or a :class:`Priority` name; lower runs first, ties
            keep registration order.
    """

    priority: int | str = Priority.NORMAL
    # Points this instance does not need although its class defines them (decided at
    # construction, e.g. a checkpoint hook that saves only by epoch): never dispatched.
    disabled_points: frozenset[str] = frozenset()

    def state_dict(self) -> dict[str, Any]:
        """State to put in checkpoints (plain data and tensors only)."""
        return {}

    def next_train_iter(self, state: Any) -> int | None:
        """Override to have ``after_train_iter`` called only at the iterations this
        returns (a hook that does not override it is called at every iteration).

        Returns the first iteration (0-based, ``state.iter`` counting) from
        ``state.iter`` on whose ``after_train_iter`` this hook needs (``state.iter``:
        this one), or None: none in this run of batches. The loop asks when a run of
        batches starts (an epoch opens, training goes on after a validation or a
        resume) and right after each call it made; an answer past the running epoch's
        end is asked again when the next one opens. ``after_train_iter`` may also be
        called at other iterations (when another hook is due): it must check for itself."""
        return None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(priority={self.priority!r})"


def _define_points() -> None:
    # Give the base class a no-op for every point so subclasses can call super().
    def make(name: str) -> Callable[..., None]:
        def point(self: Hook, trainer: "RunView", *args: Any) -> None:
            return None

        point.__name__ = name
        point.__qualname__ = f"Hook.{name}"
        point.__doc__ = f"Called at ``{name}``; arguments after the trainer: {HOOK_POINTS[name] or 'none'}."
        return point

    for name in HOOK_POINTS:
        setattr(Hook, name, make(name))


_define_points()


def check_hook_points(hook: Hook, where: str = "hook") -> None:
    """Refuse a hook whose methods could never be called as its author meant.

    A public method named ``before_*`` / ``after_*`` that is not in :data:`HOOK_POINTS`
    (``after_train_iteration``, ``before_epoch``) would silently never run: a
    ``ValueError`` names it and the closest point. A hook point defined with
    parameters that cannot take the point's arguments (``after_train_iter(self,
    trainer)``) would fail mid-training: a ``TypeError`` names it and the arguments.
    ``where`` names the hook in the message (e.g. ``hooks[0]``).
    """
    cls = type(hook)
    for klass in cls.__mro__:
        if klass is Hook or klass is object:
            continue
        for name in vars(klass):
            if not name.startswith(("before_", "after_")) or name in HOOK_POINTS:
                continue
            if not callable(getattr(hook, name, None)):  # e.g. a setting such as after_run_timeout = 5
                continue
            close = closest(name, HOOK_POINTS, n=1, cutoff=0.5)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ValueError(f"{where} ({cls.__name__}): method {name!r} looks like a hook point but is not one, so it "
                             f"would never be called; {hint}expected one of {', '.join(HOOK_POINTS)}")
    for point, args in HOOK_POINTS.items():
        if not implements(hook, point):
            continue
        try:
            signature = inspect.signature(getattr(hook, point))
        except (TypeError, ValueError):  # no signature to read (e.g. some builtins): the call decides
            continue
        try:
            signature.bind("trainer", *args)
        except TypeError:
            expected = ", ".join(("self", "trainer", *args))
            raise TypeError(f"{where} ({cls.__name__}): {point}{signature} cannot take the hook point's arguments; "
                            f"expected {point}({expected})") from None


def implements(hook: Hook, point: str) -> bool:
    """True when ``hook``'s class overrides ``point`` (the base no-op does not count)
    and the instance has not disabled it."""
    return getattr(type(hook), point) is not getattr(Hook, point) and point not in hook.disabled_points


def sort_hooks(hooks: Iterable[Hook]) -> list[Hook]:
    """Stable sort by priority: equal priorities keep registration order."""
    return sorted(hooks, key=lambda h: get_priority(h.priority))


def build_dispatch(hooks: Iterable[Hook]) -> dict[str, tuple[Callable[..., Any], ...]]:
    """One tuple of bound methods per hook point, in priority order, built once."""
    ordered = sort_hooks(hooks)
    return {point: tuple(getattr(h, point) for h in ordered if implements(h, point)) for point in HOOK_POINTS}


def describe_order(hooks: Iterable[Hook]) -> str:
    """A table of which hooks run at each point, in order, for the log at start."""
    ordered = sort_hooks(hooks)
    lines = []
    for point in HOOK_POINTS:
        names = [f"{type(h).__name__}({get_priority(h.priority)}"
                 + (", when due)" if point == "after_train_iter" and schedules(h) else ")")
                 for h in ordered if implements(h, point)]
        if names:
            lines.append(f"  {point:<24} " + " -> ".join(names))
    return "hook order:\n" + ("\n".join(lines) if lines else "  (no hooks)")


def every_nth_iter(state: Any, n: int) -> int:
    """For :meth:`Hook.next_train_iter`: the first iteration from ``state.iter`` after which
    a multiple of ``n`` iterations are done, or the run's last one if it comes first."""
    due = state.iter + (-(state.iter + 1)) % n
    return min(due, state.max_iters - 1) if state.max_iters else due


def schedules(hook: Hook) -> bool:
    """True when ``hook``'s class names the iterations it needs (:meth:`Hook.next_train_iter`)."""
    return type(hook).next_train_iter is not Hook.next_train_iter


class HookDispatcher:
    """The hooks of one trainer, by point: ``dispatcher.call(point, trainer, *args)``, and
    ``dispatcher.table[point]`` (a tuple of bound methods, priority order) for the loops'
    per-iteration points, read once per epoch instead of per call.

    The table is one dict updated in place by :meth:`rebuild`, so a loop built before a
    hook was registered sees it too."""

    def __init__(self, hooks: Iterable[Hook] = ()) -> None:
        self.table: dict[str, tuple[Callable[..., Any], ...]] = {}
        self._scheduled: list[Hook] = []  # after_train_iter hooks that name their iterations
        self.rebuild(hooks)

    def rebuild(self, hooks: Iterable[Hook]) -> None:
        hooks = list(hooks)
        self.table.clear()
        self.table.update(build_dispatch(hooks))
        self._scheduled[:] = [h for h in sort_hooks(hooks) if implements(h, "after_train_iter") and schedules(h)]

    def after_train_iter_plan(self, state: Any) -> tuple[tuple[Callable[..., Any], ...], int]:
        """``(every, due)`` for a run of batches starting at ``state.iter``: the
        ``after_train_iter`` methods to call at each iteration, and the first iteration
        at which a scheduled hook is due (then the loop calls the whole
        ``table["after_train_iter"]``); -1: none is, in this run of batches."""
        scheduled = {id(h) for h in self._scheduled}
        every = tuple(fn for fn in self.table["after_train_iter"] if id(getattr(fn, "__self__", None)) not in scheduled)
        return every, self.next_due(state)

    def next_due(self, state: Any) -> int:
        """The first iteration from ``state.iter`` at which a scheduled ``after_train_iter``
        hook is due; -1 when none names one (each answer is at least ``state.iter``)."""
        due = -1
        for h in self._scheduled:
            i = h.next_train_iter(state)
            if i is None:  # none in this run of batches
                continue
            i = max(int(i), state.iter)
            if due < 0 or i < due:
                due = i
        return due

    def call(self, point: str, trainer: Any, *args: Any) -> None:
        for fn in self.table[point]:
            fn(trainer, *args)

    def call_all(self, point: str, trainer: Any, error: BaseException | None) -> None:
        """Call every hook of ``point`` even when one fails (``after_run``: they close files
        and wait for saves). The run's ``error`` stays the one raised (the caller raises
        it): a hook's failure is then logged and added to it as a note. Without one, the
        first hook failure is raised."""
        raised = error
        for fn in self.table[point]:
            try:
                fn(trainer)
            except Exception as e:
                if raised is None:
                    raised = e
                    continue
                what = f"{type(getattr(fn, '__self__', None)).__name__}.{point} also failed: {type(e).__name__}: {e}"
                from treadle.logging.writers import CONSOLE_ONLY, FILE_ONLY, get_logger

                # Its traceback goes to the text log; the console gets one line, or none when it
                # is the same OS error as the run's (a full disk met again while closing the logs).
                line = f"{what} (raising the earlier {type(raised).__name__})"
                get_logger().error(line, exc_info=e, extra=FILE_ONLY)
                if not (isinstance(e, OSError) and isinstance(raised, OSError) and e.errno == raised.errno):
                    get_logger().error(line, extra=CONSOLE_ONLY)
                raised.add_note(what)
        if raised is not None and raised is not error:
            raise raised


class HookStates:
    """The state of every hook, keyed by class name (``#n`` for repeats), for checkpoints.

    ``hooks()`` gives the current list (hooks can be registered after construction). On
    load, a saved key with no hook of that name here is ignored (a hook removed since)."""

    def __init__(self, hooks: Callable[[], list[Hook]]) -> None:
        self.hooks = hooks

    def keyed(self) -> dict[str, Hook]:
        keys: dict[str, Hook] = {}
        for h in self.hooks():
            name = type(h).__name__
            key, n = name, 1
            while key in keys:
                n += 1
                key = f"{name}#{n}"
            keys[key] = h
        return keys

    def state_dict(self) -> dict[str, Any]:
        return {key: h.state_dict() for key, h in self.keyed().items()}

    def check_state_dict(self, state: Any) -> None:
        if not isinstance(state, dict):
            from treadle.checkpoint.io import CheckpointError

            raise CheckpointError(f"the checkpoint's hook states are a {type(state).__name__}, not a dict")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        hooks = self.keyed()
        for key, hstate in state.items():
            if key in hooks:
                hooks[key].load_state_dict(hstate)
