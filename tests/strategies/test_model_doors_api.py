"""A big pretrained model given from Python as its spec is never held whole by one process
under FSDP on 2 processes: ``treadle.Trainer(dict(type=LlamaForCausalLM, pretrained=DIR),
strategy=...).fit()``, and a hand-written loop's ``strategy.prepare(dict(...))`` then a step.
Each rank's peak memory once the model is prepared against the same run of a tiny model
(tests/big_model_support.py): built whole, a process would peak the whole model (about 79 MiB)
above it; on the meta device each holds about its half."""

from __future__ import annotations

import pytest

from big_model_support import PeakAtStart, Tokens, assert_never_whole, peak_rss, save_models
from dist_support import run_ranks
from support import fsdp_on_cpu

pytestmark = [pytest.mark.slow, fsdp_on_cpu]
pytest.importorskip("transformers")

FSDP = dict(type="fsdp", wrap=["LlamaDecoderLayer"])


def trainer_door(rank: int, world_size: int, folder: str) -> int:
    """One step of the Trainer given the spec; this process's peak when the run starts."""
    from torch.utils.data import DataLoader
    from transformers import LlamaForCausalLM

    import treadle

    peak = PeakAtStart()
    treadle.Trainer(dict(type=LlamaForCausalLM, pretrained=folder), strategy=FSDP,
                    train_dataloader=DataLoader(Tokens(), batch_size=2), optimizer=dict(type="SGD", lr=0.0),
                    max_iters=1, checkpoint=False, hooks=[peak], progress=False, seed=0).fit()
    return peak.peak


def hand_loop_door(rank: int, world_size: int, folder: str) -> int:
    """The Strategy API in a loop of one's own, given the spec: this process's peak once it is
    prepared, then one step by hand."""
    from torch.utils.data import DataLoader
    from transformers import LlamaForCausalLM

    import treadle

    strategy = treadle.build_strategy(FSDP, seed=0)
    model, optim_wrapper = strategy.prepare(dict(type=LlamaForCausalLM, pretrained=folder),
                                            optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.0)))
    peak = peak_rss()
    batch = next(iter(strategy.prepare_dataloader(DataLoader(Tokens(), batch_size=2))))
    with optim_wrapper.optim_context(model):
        optim_wrapper.update_params(model(**batch).loss)
    return peak


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return root, save_models(root)


@pytest.mark.parametrize("door", [trainer_door, hand_loop_door], ids=["trainer", "hand_loop"])
def test_a_pretrained_model_from_python_is_never_whole_in_one_process(models, door):
    root, size = models
    big, tiny = (run_ranks(door, 2, args=(str(root / name),), timeout_s=400) for name in ("big", "tiny"))
    assert_never_whole(big, tiny, size)
