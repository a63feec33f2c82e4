""""Did you mean": one ranking for config keys, type names and the Trainer's arguments."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import treadle
from treadle.components.errors import ConfigError
from treadle.hooks.base import Hook, check_hook_points
from treadle.optim.builder import optimizer_names
from treadle.suggest import closest, did_you_mean

from support import TinyNet


@pytest.mark.parametrize("word, first", [
    ("AdamX", "AdamW"),      # a letter replaced beats one dropped (Adam) or added (Adamax)
    ("adamw", "AdamW"),      # case
    ("Adma", "Adam"),        # two letters swapped
    ("Adamm", "Adam"),       # a letter typed twice
    ("SDG", "SGD"),
    ("RMSProp", "RMSprop"),
])
def test_the_likeliest_optimizer_comes_first(word, first):
    assert closest(word, optimizer_names())[0] == first


def test_nothing_close_suggests_nothing():
    assert closest("Transformer", optimizer_names()) == []
    assert did_you_mean("Transformer", optimizer_names()) == ""


def test_without_slips_difflib_alone_says_what_is_close():
    """A slip of a short name rates below 0.8 with difflib: a suggestion, not a misspelt key."""
    import difflib

    assert difflib.SequenceMatcher(None, "norm", "form").ratio() < 0.8
    assert closest("norm", ["form"], n=1, cutoff=0.8) == ["form"]
    assert closest("norm", ["form"], n=1, cutoff=0.8, slips=False) == []
    assert closest("max_epoch", ["max_iters", "max_epochs"], n=1, cutoff=0.8, slips=False) == ["max_epochs"]


def test_the_hint_lists_up_to_three():
    assert did_you_mean("AdamX", optimizer_names()) == " Did you mean 'AdamW', 'Adam' or 'Adamax'?"
    assert did_you_mean("max_epoch", ["max_epochs", "max_iters"]) == " Did you mean 'max_epochs'?"


def _trainer(**kw):
    args = dict(train_dataloader=[(torch.randn(4, 4), torch.zeros(4, dtype=torch.long))], loss_fn=nn.CrossEntropyLoss(),
                optimizer=dict(type="SGD", lr=0.1), max_epochs=1, progress=False)
    args.update(kw)
    return treadle.Trainer(TinyNet(), **args)


def test_a_misspelt_trainer_argument_in_python_names_the_right_one():
    with pytest.raises(TypeError, match=r"^Trainer.__init__\(\) got an unexpected keyword argument 'max_epoch'\. "
                                        r"Did you mean 'max_epochs'\?$"):
        treadle.Trainer(TinyNet(), max_epoch=3)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'zzz'$"):  # nothing close: no hint
        treadle.Trainer(TinyNet(), zzz=3)


@pytest.mark.parametrize("kw, message", [
    (dict(optimizer=dict(type="AdamX", lr=0.1)), r"unknown optimizer type 'AdamX'.*Did you mean 'AdamW'"),
    (dict(schedulers=[dict(type="CosineAnealingLR")]), r"unknown scheduler type.*Did you mean 'CosineAnnealingLR'"),
    (dict(hooks=[dict(type="EMAHok")]), r"hooks\[0\]\.type: unknown hook type \(got 'EMAHok'\).*Did you mean 'EMAHook'"),
])
def test_misspelt_type_names_in_python(kw, message):
    with pytest.raises((ValueError, ConfigError), match=message):
        _trainer(**kw)


def test_a_misspelt_hook_point_names_the_right_one():
    class Late(Hook):
        def after_train_iteration(self, trainer, batch, outputs):
            pass

    with pytest.raises(ValueError, match=r"did you mean 'after_train_iter'\?"):
        check_hook_points(Late(), "hooks[0]")
