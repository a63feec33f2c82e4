"""Arguments defined once: a dataclass whose fields are a constructor's arguments.

Each field is ``name: Annotated[T, Arg(...)] = default``: the argument's name, its type
``T`` (what type checkers and ``inspect.signature`` see), its default, and an :class:`Arg`
with its one documentation text, the types a config file may give it, the Python
objects it takes besides, and its checks. From that one dataclass come

* :func:`takes`: an ``__init__`` whose parameters are the fields (names, order, defaults,
  types; editors and type checkers read them through the decorator's types), called
  with one instance of the dataclass;
* :func:`check_args`: every value checked, a config-typed one as a config file's would be;
* :func:`config_keys` / :func:`config_defaults`: the keys a config file may set;
* :func:`document`: the ``Args:`` section of the class docstring.

Nothing here knows the Trainer: its arguments are ``TrainerArgs`` (treadle/engine/spec.py).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import re
import textwrap
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Concatenate, ParamSpec, TypeVar

from torch import nn

from treadle.components.errors import ConfigError
from treadle.components.keys import Check, Key, check_value
from treadle.suggest import did_you_mean

P = ParamSpec("P")
A = TypeVar("A")
S = TypeVar("S")
C = TypeVar("C", bound=type)

#: ``Arg.objects`` for an argument that takes any object besides its config types (a
#: DataLoader, a callable...): the object's own checks apply, not the config's.
ANY_OBJECT: tuple[type, ...] = (object,)


@dataclass(frozen=True)
class Arg:
    """What one argument is besides its name, type and default."""

    #: Its meaning: the docstring's line and the config reference's (docs/config.md).
    doc: str
    #: The types a config file may give it (YAML's: dict, list, str, int, float, bool,
    #: NoneType); None: not a config key.
    config: tuple[type, ...] | None = None
    #: What a config value should be, as error messages and the reference say it.
    expected: str = ""
    #: A config-typed value's own check (range, choices, keys); raises a ConfigError.
    check: Check | None = None
    #: Python objects it takes besides the config types, checked by their builders.
    objects: tuple[type, ...] = ()
    #: ``(name, value) -> value``: checks (and may normalize) the value as given in
    #: Python, whatever its type; raises TypeError/ValueError naming the argument.
    convert: Callable[[str, Any], Any] | None = None
    #: The commands (``train``, ``validate``, ``test``) for which a config file must give it
    #: (treadle/config/resolve.py checks them).
    required_by: tuple[str, ...] = ()
    #: Only training reads it: ``treadle validate`` and ``test`` leave it at its default.
    training_only: bool = False


def flag(doc: str) -> Arg:
    """A True/False argument."""
    return Arg(doc, (bool,), "true or false")


@dataclass(frozen=True)
class Param:
    """One field of an argument dataclass, read: name, type, default, :class:`Arg`."""

    name: str
    type: Any
    default: Any  # inspect.Parameter.empty when the argument is required
    arg: Arg

    @property
    def key(self) -> Key | None:
        """The config key, or None when a config file may not set it."""
        a = self.arg
        return None if a.config is None else Key(self.name, a.config, a.expected, a.doc, a.check, a.objects)


@functools.cache
def params(spec: type) -> tuple[Param, ...]:
    """The fields of the dataclass ``spec``, in order; each must be annotated
    ``Annotated[T, Arg(...)]``."""
    hints = typing.get_type_hints(spec, include_extras=True)
    out = []
    for f in dataclasses.fields(spec):
        hint = hints[f.name]
        annotated = typing.get_origin(hint) is Annotated
        found = [m for m in typing.get_args(hint)[1:] if isinstance(m, Arg)] if annotated else []
        if len(found) != 1:
            raise TypeError(f"{spec.__qualname__}.{f.name} is annotated {hint!r}; expected Annotated[type, Arg(...)] "
                            "with one Arg")
        if f.default_factory is not dataclasses.MISSING:
            raise TypeError(f"{spec.__qualname__}.{f.name} has a default_factory; give a plain (immutable) default")
        default = f.default if f.default is not dataclasses.MISSING else inspect.Parameter.empty
        out.append(Param(f.name, typing.get_args(hint)[0], default, found[0]))
    return tuple(out)


def signature(spec: type) -> inspect.Signature:
    """``spec``'s fields as parameters (the types without their :class:`Arg`), ``self`` first."""
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    fields = [inspect.Parameter(p.name, kind, default=p.default, annotation=p.type) for p in params(spec)]
    return inspect.Signature([inspect.Parameter("self", kind), *fields], return_annotation=None)


def takes(spec: Callable[P, A]) -> Callable[[Callable[[S, A], None]], Callable[Concatenate[S, P], None]]:
    """Decorate ``__init__(self, args: spec)``: the class is then called with ``spec``'s
    parameters (positional or by name, as ``spec`` takes them), and ``__init__`` gets them
    as one ``spec`` instance. ``inspect.signature`` shows ``spec``'s fields; type
    checkers see them through this function's types. A call that does not fit is the
    TypeError Python gives, naming the class's ``__init__``."""
    assert isinstance(spec, type)
    own = f"{spec.__qualname__}.__init__()"
    sig = signature(spec)

    def decorate(init: Callable[[S, A], None]) -> Callable[Concatenate[S, P], None]:
        @functools.wraps(init)
        def __init__(self: S, /, *args: P.args, **kwargs: P.kwargs) -> None:
            try:
                given = spec(*args, **kwargs)
            except TypeError as e:  # the dataclass's own: unknown, missing or too many arguments
                if not str(e).startswith(own):
                    raise
                raise TypeError(f"{init.__qualname__}(){str(e)[len(own):]}{_unexpected_hint(e, sig)}") from None
            init(self, given)

        __init__.__signature__ = sig  # type: ignore[attr-defined]  # what inspect.signature and help() show
        __init__.__annotations__ = {**{name: p.annotation for name, p in list(sig.parameters.items())[1:]},
                                    "return": None}
        return __init__
    return decorate


def _unexpected_hint(error: TypeError, sig: inspect.Signature) -> str:
    """`` Did you mean 'max_epochs'?`` for an unexpected keyword argument's name."""
    found = re.search(r"unexpected keyword argument '(\w+)'", str(error))
    hint = did_you_mean(found.group(1), list(sig.parameters)[1:]) if found else ""
    return "." + hint if hint else ""


def _type_name(t: type) -> str:
    return {os.PathLike: "a path", nn.Module: "an nn.Module"}.get(t, f"a {t.__module__.split('.')[0]}.{t.__qualname__}"
                                                                      if t.__module__ != "builtins" else t.__name__)


def _check_config(key: Key, value: Any) -> None:
    """A value of a config type is checked as a config file's would be (a tuple as a
    list); any other value the key also takes (``objects``) is left to its builder."""
    if isinstance(value, tuple):
        value = list(value)
    of_config_type = any(isinstance(value, t) for t in key.types)
    if not of_config_type and isinstance(value, key.objects):
        return
    try:
        check_value(key, value, key.name)
    except ConfigError as e:
        if e.problem.startswith("wrong type"):
            expected = e.expected
            if key.objects and key.objects != ANY_OBJECT and "path" not in expected:  # what Python may pass too
                expected += ", or " + " or ".join(_type_name(t) for t in key.objects)
            raise TypeError(str(ConfigError(e.path, e.problem, value=e.value, expected=expected))) from None
        raise


def check_args(given: A) -> A:
    """``given`` (an instance of an argument dataclass) with every argument checked, in
    order: its config check (:attr:`Arg.config`, :attr:`Arg.check`), then
    :attr:`Arg.convert`, whose result replaces the value. Raises TypeError for a value of
    the wrong type, ValueError (a ConfigError) for one out of range; both name the
    argument."""
    spec: type = type(given)
    changes = {}
    for p in params(spec):
        value = getattr(given, p.name)
        key = p.key
        if key is not None:
            _check_config(key, value)
        if p.arg.convert is not None:
            new = p.arg.convert(p.name, value)
            if new is not value:
                changes[p.name] = new
    return dataclasses.replace(given, **changes) if changes else given  # type: ignore[type-var]  # given is a dataclass (A cannot say so)


def config_keys(spec: type) -> tuple[Key, ...]:
    """The config keys of ``spec``'s arguments, in order (those with :attr:`Arg.config`)."""
    return tuple(p.key for p in params(spec) if p.key is not None)


def config_defaults(spec: type) -> dict[str, Any]:
    """Each config key's default as a config file holds it (a tuple as a list; None for
    a required argument), in order."""
    out: dict[str, Any] = {}
    for p in params(spec):
        if p.key is not None:
            out[p.name] = None if p.default is inspect.Parameter.empty else (
                list(p.default) if isinstance(p.default, tuple) else p.default)
    return out


def args_section(spec: type, width: int = 100) -> str:
    """The ``Args:`` section of a docstring: each argument and its :attr:`Arg.doc`."""
    lines = ["Args:"]
    for p in params(spec):
        lines.append(textwrap.fill(f"{p.name}: {p.arg.doc}", width, initial_indent="    ", subsequent_indent="        ",
                                   break_on_hyphens=False))
    return "\n".join(lines)


def document(spec: type) -> Callable[[C], C]:
    """Class decorator: the class docstring followed by :func:`args_section` of ``spec``
    (``help(cls)`` lists every argument with its documentation)."""
    def decorate(cls: C) -> C:
        cls.__doc__ = inspect.cleandoc(cls.__doc__ or "") + "\n\n" + args_section(spec)
        return cls
    return decorate


__all__ = ["ANY_OBJECT", "Arg", "Param", "args_section", "check_args", "config_defaults", "config_keys", "document",
           "flag", "params", "signature", "takes"]
