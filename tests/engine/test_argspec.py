"""Each Trainer argument is defined once (``TrainerArgs``, treadle/engine/spec.py): the
signature, the docstring, the checks, the config keys (and so ``--set`` and
docs/config.md) all come from that definition."""

from __future__ import annotations

import inspect
import os
import pydoc
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import pytest
from torch import nn

import treadle
from treadle.config import SCHEMA
from treadle.components.keys import _min
from treadle.config.schema import NOT_CONFIG_KEYS, PROJECT_KEYS, trainer_defaults
from treadle.engine.argspec import Arg, args_section, check_args, config_defaults, config_keys, document, params, takes
from treadle.engine.spec import TRAINER_KEYS, TrainerArgs

ROOT = Path(__file__).resolve().parents[2]

# The public signature as it was written out in Trainer.__init__ before the arguments
# were defined once: names, order and defaults must not change. New arguments go at the
# end (a caller passing arguments by position keeps its meaning): init_weights, fast_dev_run,
# limit_*_batches, activation_checkpointing, test_metrics.
PUBLIC = [
    ("model", inspect.Parameter.empty), ("work_dir", None), ("train_dataloader", None), ("val_dataloader", None),
    ("test_dataloader", None), ("loss_fn", None), ("optimizer", None), ("schedulers", None), ("max_epochs", None),
    ("max_iters", None), ("val_interval", 1), ("workflow", None), ("metrics", None), ("train_metrics", None),
    ("train_metrics_reset", "interval"), ("hooks", ()), ("precision", "32"), ("accumulate", 1), ("clip_grad", None),
    ("ema", None), ("strategy", "auto"), ("seed", None), ("seed_per_rank", False), ("seed_per_sample", True),
    ("deterministic", False), ("resume", False), ("load_from", None), ("checkpoint", None), ("log_interval", 50),
    ("compile", False), ("auto_scale_lr", None), ("preemption", True), ("nan_guard", "raise"),
    ("log_writers", ("jsonl", "csv", "tensorboard")), ("progress", "auto"), ("timer_breakdown", False),
    ("move_batch", True), ("safe", False), ("verbose", False), ("init_weights", False), ("fast_dev_run", False),
    ("limit_train_batches", None), ("limit_val_batches", None), ("limit_test_batches", None),
    ("accumulate_across_epochs", False), ("loss_scale", "dynamic"), ("activation_checkpointing", None),
    ("test_metrics", None),
]


def test_public_signature_keeps_its_names_order_and_defaults():
    sig = inspect.signature(treadle.Trainer)
    assert [(name, p.default) for name, p in sig.parameters.items()] == PUBLIC
    assert {p.kind for p in sig.parameters.values()} == {inspect.Parameter.POSITIONAL_OR_KEYWORD}
    assert sig.parameters["max_epochs"].annotation == int | None  # the type, without its Arg
    assert next(iter(inspect.signature(treadle.Trainer.__init__).parameters)) == "self"


def test_a_call_that_does_not_fit_names_the_trainer():
    with pytest.raises(TypeError, match=r"^Trainer.__init__\(\) missing 1 required positional argument: 'model'$"):
        treadle.Trainer()
    with pytest.raises(TypeError, match=r"^Trainer.__init__\(\) got an unexpected keyword argument 'max_epoch'\. "
                                        r"Did you mean 'max_epochs'\?$"):
        treadle.Trainer(nn.Linear(2, 2), max_epoch=3)
    with pytest.raises(TypeError, match=r"^Trainer.__init__\(\) got multiple values for argument 'model'$"):
        treadle.Trainer(nn.Linear(2, 2), model=nn.Linear(2, 2))


def test_positional_model_and_work_dir(tmp_path):
    t = treadle.Trainer(nn.Linear(2, 2), tmp_path / "run", progress=False)
    assert t.work_dir == tmp_path / "run" and isinstance(t.module, nn.Linear)


def test_docstring_lists_every_argument_with_its_doc():
    text = pydoc.render_doc(treadle.Trainer, renderer=pydoc.plaintext)
    flat = " ".join(text.replace("|", " ").split())  # help()'s text: lines start with "|"
    for p in params(TrainerArgs):
        assert f"{p.name}: {' '.join(p.arg.doc.replace('|', ' ').split())}" in flat, p.name
    assert "Config dicts:" in flat  # the hand-written part stays


def test_config_keys_are_the_arguments_less_safe():
    assert NOT_CONFIG_KEYS == ("safe",)
    assert [k.name for k in TRAINER_KEYS] == [name for name, _ in PUBLIC if name != "safe"] == \
        [k for k in SCHEMA if k not in {p.name for p in PROJECT_KEYS}]
    defaults = trainer_defaults()
    assert defaults["model"] is None and defaults["log_writers"] == ["jsonl", "csv", "tensorboard"]
    assert defaults["val_interval"] == 1 and "safe" not in defaults


# -- a new argument: one more field -------------------------------------------------------
@dataclass(frozen=True)
class WithWarmup(TrainerArgs):
    warmup: Annotated[int, Arg("Warm-up iterations before the schedule starts.", (int,), "an int >= 0", _min(0))] = 0


@document(WithWarmup)
class Toy:
    """A class that takes the Trainer's arguments and one more."""

    @takes(WithWarmup)
    def __init__(self, args: WithWarmup) -> None:
        self.args = check_args(args)


def test_a_new_field_appears_in_signature_docstring_and_config_keys():
    sig = inspect.signature(Toy)
    assert list(sig.parameters) == [*(name for name, _ in PUBLIC), "warmup"]
    assert sig.parameters["warmup"].default == 0 and sig.parameters["warmup"].annotation is int
    assert "    warmup: Warm-up iterations before the schedule starts." in Toy.__doc__
    assert Toy.__doc__.startswith("A class that takes the Trainer's arguments and one more.")
    assert args_section(WithWarmup).startswith(args_section(TrainerArgs))
    key = config_keys(WithWarmup)[-1]
    assert (key.name, key.types, key.expected) == ("warmup", (int,), "an int >= 0")
    assert list(config_defaults(WithWarmup))[-1] == "warmup" and config_defaults(WithWarmup)["warmup"] == 0


def test_a_new_field_is_checked():
    model = nn.Linear(2, 2)
    assert Toy(model, warmup=3).args.warmup == 3
    assert Toy(model).args.hooks == []  # the Trainer's own checks run too: hooks become a list
    with pytest.raises(ValueError, match=r"^warmup: out of range \(got -1\); expected an int >= 0$"):
        Toy(model, warmup=-1)
    with pytest.raises(TypeError, match=r"^warmup: wrong type str \(got '3'\); expected an int >= 0$"):
        Toy(model, warmup="3")
    with pytest.raises(TypeError, match=r"^Toy.__init__\(\) got an unexpected keyword argument 'warmpu'\. "
                                        r"Did you mean 'warmup'\?$"):
        Toy(model, warmpu=3)


def test_a_field_without_an_arg_is_refused():
    @dataclass(frozen=True)
    class Bare:
        lr: float = 0.1

    with pytest.raises(TypeError, match=r"Bare.lr is annotated .*; expected Annotated\[type, Arg\(...\)\]"):
        params(Bare)


# -- the whole chain, with a field added to the source ------------------------------------------
NEW_FIELD = '''    warmup: Annotated[int, Arg(
        "Warm-up iterations before the schedule starts.", (int,), "an int >= 0", _min(0))] = 0
'''

CHECK = textwrap.dedent('''
    import inspect, sys
    from torch import nn
    import treadle
    from treadle.config import ConfigError, SCHEMA, resolve_config
    from treadle.config.reference import render_reference

    names = list(inspect.signature(treadle.Trainer).parameters)
    assert names[names.index("warmup") + 1] == "verbose"  # where it was added
    assert inspect.signature(treadle.Trainer).parameters["warmup"].default == 0
    assert "warmup: Warm-up iterations before the schedule starts." in treadle.Trainer.__doc__
    assert "warmup" in SCHEMA and "| `warmup` | an int >= 0 | `0` | Warm-up iterations" in render_reference()
    base = {"model": {"type": "torch.nn.Linear", "in_features": 2, "out_features": 2}}
    assert resolve_config(base, ["warmup=5"])["warmup"] == 5
    for override, message in (("warmup=-1", "warmup: out of range (got -1); expected an int >= 0"),
                              ("warmpu=1", "Did you mean 'warmup'?")):
        try:
            resolve_config(base, [override])
            raise AssertionError(override)
        except ConfigError as e:
            assert message in str(e), str(e)
    try:
        treadle.Trainer(nn.Linear(2, 2), warmup=-1)
        raise AssertionError("not checked")
    except ValueError as e:
        assert str(e) == "warmup: out of range (got -1); expected an int >= 0", str(e)
    assert treadle.Trainer(nn.Linear(2, 2), warmup=4, progress=False) is not None
    print("ok")
''')


@pytest.mark.slow
def test_a_field_added_to_the_spec_reaches_signature_docs_config_cli_and_checks(tmp_path):
    """Copy the package, add one field to TrainerArgs, and look everywhere for it."""
    shutil.copytree(ROOT / "treadle", tmp_path / "treadle", ignore=shutil.ignore_patterns("__pycache__"))
    spec = tmp_path / "treadle" / "engine" / "spec.py"
    text = spec.read_text()
    anchor = "    verbose: Annotated[bool, flag("
    assert text.count(anchor) == 1
    spec.write_text(text.replace(anchor, NEW_FIELD + anchor))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", CHECK], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    # The command line's --set: the same key, checked the same way.
    config = tmp_path / "tiny.yaml"
    config.write_text("model: {type: torch.nn.Linear, in_features: 2, out_features: 2}\n")
    cli = subprocess.run([sys.executable, "-m", "treadle", "train", str(config), "--set", "warmup=-1"], env=env,
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert cli.returncode != 0 and "warmup: out of range (got -1); expected an int >= 0" in cli.stderr, cli.stderr
