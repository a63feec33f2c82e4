"""What an MMEngine hook's class does with its runner and checkpoints, read from its source before
training (treadle/openmmlab/hooks.py adapts the hook).

**Refused before training.** The source of each method of the hook's class and of its bases up to
``mmengine.hooks.Hook`` is read (``inspect`` + ``ast``). In the points and MMEngine's helpers the
parameter after ``self`` is the runner, in any other method a parameter named ``runner``, and a
parameter a ``self.method(...)`` / ``super().method(...)`` call passes the runner to. Each
``runner.<attr>`` (and ``getattr(runner, "<attr>")``) the view lacks, and that the hook does not set
itself, is refused in one line (a :class:`ConfigError` at the config path); so is an attribute of
``train_loop``/``val_loop``/``test_loop`` their views lack, setting one of the view's own names, and
any use of the checkpoint keys treadle's checkpointer owns (``state_dict``, ``optimizer``,
``param_schedulers``, ``message_hub``: a hook that rewrites the saved weights, as MMEngine's EMAHook,
cannot be honoured; treadle has ``ema=``). What escapes the rule: ``getattr`` with a computed name,
the runner kept on ``self`` or handed to a function outside the class, a class whose source cannot be
read (a warning says so); ``hasattr(runner, ...)`` counts as no read.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any

from treadle.components.errors import ConfigError
from treadle.openmmlab.mm import import_mmengine
from treadle.openmmlab.runner_view import EvalLoopView, RunnerView, TrainLoopView

#: The MMEngine points treadle forwards (every point of ``mmengine.hooks.Hook``).
MM_POINTS = ("before_run", "after_run", "before_train", "after_train", "before_train_epoch", "after_train_epoch",
             "before_train_iter", "after_train_iter", "before_val", "after_val", "before_val_epoch", "after_val_epoch",
             "before_val_iter", "after_val_iter", "before_test", "after_test", "before_test_epoch", "after_test_epoch",
             "before_test_iter", "after_test_iter", "before_save_checkpoint", "after_load_checkpoint")
#: MMEngine's helpers and the points of ``Hook`` that call them.
HELPERS = {f"_{when}_{what}": tuple(f"{when}_{mode}_{what}" for mode in ("train", "val", "test"))
           for when in ("before", "after") for what in ("epoch", "iter")}
#: Checkpoint keys whose content treadle's checkpointer owns (weights, optimizers, schedulers, hub).
RESERVED_KEYS = ("state_dict", "optimizer", "param_schedulers", "message_hub")
_CHECKPOINT_POINTS = ("before_save_checkpoint", "after_load_checkpoint")


def mm_hook() -> type:
    return import_mmengine("an MMEngine hook", "hooks").Hook


def _class_methods(cls: type) -> tuple[dict[str, list[ast.FunctionDef]], list[str]]:
    """The method definitions of ``cls`` and its bases up to MMEngine's ``Hook``, by name, and the
    classes whose source cannot be read."""
    base, defs, unread = mm_hook(), {}, []
    for klass in cls.__mro__:
        if klass is base:
            break
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            unread.append(klass.__qualname__)
            continue
        node = tree.body[0]
        for f in getattr(node, "body", []):
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
                defs.setdefault(f.name, []).append(f)
    return defs, unread


def _params(f: ast.FunctionDef) -> list[str]:
    return [a.arg for a in (*f.args.posonlyargs, *f.args.args)]


def _roles(defs: dict[str, list[ast.FunctionDef]]) -> dict[ast.FunctionDef, dict[str, str]]:
    """Per method, its parameters that receive the runner or a checkpoint (``{name: role}``)."""
    roles: dict[ast.FunctionDef, dict[str, str]] = {}
    for name, fs in defs.items():
        for f in fs:
            params, own = _params(f), {}
            if (name in MM_POINTS or name in HELPERS) and len(params) > 1:
                own[params[1]] = "runner"
            if name in _CHECKPOINT_POINTS and len(params) > 2:
                own[params[2]] = "checkpoint"
            own.update({p: "runner" for p in params if p == "runner"})
            roles[f] = own
    changed = True
    while changed:  # follow self.m(runner) / super().m(runner) into the class's helpers
        changed = False
        for f, own in list(roles.items()):
            for call in (n for n in ast.walk(f) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)):
                owner = call.func.value
                if not ((isinstance(owner, ast.Name) and owner.id == "self") or
                        (isinstance(owner, ast.Call) and getattr(owner.func, "id", None) == "super")):
                    continue
                passed = [(i + 1, None, a.id) for i, a in enumerate(call.args) if isinstance(a, ast.Name)]
                passed += [(None, k.arg, k.value.id) for k in call.keywords if isinstance(k.value, ast.Name)]
                for target in defs.get(call.func.attr, []):
                    params = _params(target)
                    for pos, kw, arg in passed:
                        if arg not in own:
                            continue
                        param = kw if kw is not None else params[pos] if pos < len(params) else None
                        if param is not None and roles[target].get(param) is None:
                            roles[target][param] = own[arg]
                            changed = True
    return roles


class HookUse:
    """What a hook class does with its runner and checkpoints, found in its source."""

    def __init__(self, cls: type) -> None:
        defs, self.unread = _class_methods(cls)
        self.reads: dict[str, str] = {}  # runner attribute -> a method reading it
        self.sub_reads: dict[tuple[str, str], str] = {}  # (runner attribute, its attribute) -> method
        self.sets: dict[str, str] = {}  # runner attribute the hook sets -> a method setting it
        self.keys: dict[str, str] = {}  # checkpoint key (constant) -> method using it
        for f, own in _roles(defs).items():
            for node in ast.walk(f):
                self._visit(node, own, f.name)

    def _visit(self, node: ast.AST, own: dict[str, str], where: str) -> None:
        def role(n: ast.AST) -> str | None:
            return own.get(n.id) if isinstance(n, ast.Name) else None

        if isinstance(node, ast.Attribute) and role(node.value) == "runner":
            if isinstance(node.ctx, ast.Store):
                self.sets.setdefault(node.attr, where)
            else:
                self.reads.setdefault(node.attr, where)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) \
                and role(node.value.value) == "runner":
            self.sub_reads.setdefault((node.value.attr, node.attr), where)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "setattr") and \
                len(node.args) >= 2 and role(node.args[0]) == "runner" and isinstance(node.args[1], ast.Constant):
            if node.func.id == "setattr":  # type: ignore[attr-defined]  # checked: a Name
                self.sets.setdefault(str(node.args[1].value), where)
            else:
                self.reads.setdefault(str(node.args[1].value), where)
        elif isinstance(node, ast.Subscript) and role(node.value) == "checkpoint" \
                and isinstance(node.slice, ast.Constant):
            self.keys.setdefault(str(node.slice.value), where)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and role(node.func.value) == \
                "checkpoint" and node.func.attr in ("get", "pop", "setdefault") and node.args \
                and isinstance(node.args[0], ast.Constant):
            self.keys.setdefault(str(node.args[0].value), where)
        elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant) and \
                any(role(c) == "checkpoint" for c in node.comparators):
            self.keys.setdefault(str(node.left.value), where)


def _public(cls: type) -> list[str]:
    """The attributes a view offers a hook: its properties (its methods are the adapter's)."""
    return sorted(n for n in dir(cls) if not n.startswith("_") and isinstance(getattr(cls, n), property))


def check_hook(hook: Any, path: str) -> HookUse:
    """Refuse (ConfigError at ``path``) a hook reading what the runner view lacks or editing the
    checkpoint entries treadle owns (see the module's docstring); returns what it uses."""
    cls = type(hook)
    use = HookUse(cls)
    offered = set(_public(RunnerView))
    missing = [f"runner.{a} ({m})" for a, m in sorted(use.reads.items()) if a not in offered and a not in use.sets]
    subs = {"train_loop": _public(TrainLoopView), "val_loop": _public(EvalLoopView), "test_loop": _public(EvalLoopView)}
    missing += [f"runner.{a}.{b} ({m})" for (a, b), m in sorted(use.sub_reads.items()) if a in subs and b not in subs[a]]
    fixed = [a for a in offered if getattr(RunnerView, a).fset is None]  # every offered name is a property
    missing += [f"runner.{a} = ... ({m})" for a, m in sorted(use.sets.items()) if a in fixed]
    if missing:
        names = ", ".join(sorted(offered))
        raise ConfigError(path, f"{cls.__name__} uses {', '.join(missing)}, which treadle's runner view does not "
                                "have", expected=f"a hook reading only runner.{{{names}}} (and what it sets itself)")
    owned = [f"checkpoint[{k!r}] ({m})" for k, m in sorted(use.keys.items()) if k in RESERVED_KEYS]
    if owned:
        raise ConfigError(path, f"{cls.__name__} uses {', '.join(owned)}, which treadle's checkpointer owns: a hook "
                                "cannot rewrite the saved weights, optimizer, schedulers or message hub",
                          expected="a hook that keeps its own keys in the checkpoint (for an EMA: ema=)")
    if use.unread:
        from treadle.logging.writers import get_logger

        get_logger().warning(f"{path}: cannot read the source of {', '.join(use.unread)}: what {cls.__name__} reads "
                             "of its runner is not checked before training")
    return use


def used_points(cls: type) -> tuple[str, ...]:
    """The MMEngine points ``cls`` overrides, itself or through MMEngine's helpers."""
    base = mm_hook()
    used = {p for p in MM_POINTS if getattr(cls, p, None) is not getattr(base, p)}
    for helper, points in HELPERS.items():
        if getattr(cls, helper, None) is not getattr(base, helper):
            used.update(points)
    return tuple(p for p in MM_POINTS if p in used)


__all__ = ["HELPERS", "HookUse", "MM_POINTS", "RESERVED_KEYS", "check_hook", "mm_hook", "used_points"]
