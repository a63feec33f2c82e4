"""The digests of frozen weights (treadle/checkpoint/frozen.py): sha256 of a tensor's bytes,
computed once and again only when the set of frozen parameters changes; the first
difference named."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
from torch import nn

from treadle.checkpoint import frozen
from treadle.checkpoint.frozen import FrozenDigests, check_entry, describe, first_difference, frozen_keys, tensor_sha256
from treadle.checkpoint.io import CheckpointError


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.bool])
def test_a_digest_is_the_sha256_of_the_tensors_bytes(dtype):
    t = (torch.randn(5, 7) * 3).to(dtype)
    expected = hashlib.sha256(np.ascontiguousarray(t.numpy()).tobytes()).hexdigest()
    assert tensor_sha256(t) == expected
    assert tensor_sha256(t.t().contiguous().t()) == expected  # the layout in memory does not matter: the values do


def test_bfloat16_zero_dim_and_empty_tensors_hash_their_bytes():
    t = torch.randn(4, 3).to(torch.bfloat16)
    assert tensor_sha256(t) == hashlib.sha256(t.view(torch.int16).numpy().tobytes()).hexdigest()
    assert tensor_sha256(torch.tensor(2.5)) == hashlib.sha256(np.float32(2.5).tobytes()).hexdigest()
    assert tensor_sha256(torch.empty(0, 3)) == hashlib.sha256(b"").hexdigest()


class Backbone(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.body = nn.Linear(4, 4)
        self.norm = nn.BatchNorm1d(4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight  # tied


def test_frozen_keys_name_every_alias_of_a_tied_weight_and_no_buffer():
    m = Backbone()
    m.embed.requires_grad_(False)
    m.body.requires_grad_(False)
    assert frozen_keys(m) == ["embed.weight", "body.weight", "body.bias", "head.weight"]
    d = describe(m.state_dict(), frozen_keys(m))
    assert d["head.weight"] == d["embed.weight"] == {"shape": [10, 4], "dtype": "float32",
                                                     "sha256": tensor_sha256(m.embed.weight)}


def test_digests_are_computed_once_and_again_when_the_frozen_set_changes(monkeypatch):
    m = Backbone()
    m.body.requires_grad_(False)
    hashed = []
    monkeypatch.setattr(frozen, "tensor_sha256", lambda t: hashed.append(t.shape) or "x" * 64)
    cache = FrozenDigests()
    for _ in range(3):
        assert list(cache.get(m, m.state_dict)) == ["body.weight", "body.bias"]
    assert len(hashed) == 2  # once per tensor, not per call
    m.embed.requires_grad_(False)
    assert list(cache.get(m, m.state_dict)) == ["embed.weight", "body.weight", "body.bias", "head.weight"]
    assert len(hashed) == 2 + 3  # the tied weight once
    cache.forget()
    cache.get(m, m.state_dict)
    assert len(hashed) == 5 + 3


def test_several_ranks_hash_a_share_each_and_agree():
    """Three "ranks" (threads; the gather stands in for all_gather_object): each hashes
    every third tensor; all end with every digest, those of one process."""
    import threading

    m = Backbone().requires_grad_(False)
    names = frozen_keys(m)
    alone = describe(m.state_dict(), names)
    shares: list[dict] = [{}, {}, {}]
    barrier = threading.Barrier(3)
    results: list[dict] = [{}, {}, {}]

    def gather(mine, rank):
        shares[rank] = dict(mine)
        barrier.wait()
        return list(shares)

    def rank_of(rank):
        results[rank] = describe(m.state_dict(), names, rank=rank, world_size=3, gather=lambda o: gather(o, rank))

    threads = [threading.Thread(target=rank_of, args=(r,)) for r in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert results == [alone] * 3
    hashed = [sorted(s) for s in shares]
    assert hashed == [["embed.weight", "norm.weight"], ["body.weight", "norm.bias"], ["body.bias"]]  # not head.weight: tied


def test_the_first_difference_is_named_with_what_differs():
    a = {"w": {"shape": [2, 2], "dtype": "float32", "sha256": "a" * 64},
         "v": {"shape": [3], "dtype": "float32", "sha256": "b" * 64}}
    assert first_difference(a, dict(a)) is None
    assert "'w' differs (sha256 aaaaaaaaaaaa... in the checkpoint, cccccccccccc... here)" in first_difference(
        a, {**a, "w": {**a["w"], "sha256": "c" * 64}})
    assert "'w' differs (shape (2, 2) in the checkpoint, (4,) here)" in first_difference(
        a, {**a, "w": {**a["w"], "shape": [4]}})
    assert "'v' differs (dtype float32 in the checkpoint, bfloat16 here)" in first_difference(
        a, {**a, "v": {**a["v"], "dtype": "bfloat16"}})
    assert "'v' is frozen in the checkpoint but not a frozen parameter here" in first_difference(a, {"w": a["w"]})
    assert "'u' is frozen here but not in the checkpoint" in first_difference(a, {**a, "u": a["w"]})
    assert first_difference(a, {"w": a["w"]}, names=["w"]) is None  # only the names asked about


def test_an_entry_of_another_layout_is_refused_in_one_line():
    good = {"saved": False, "digest": "sha256", "tensors": {"w": {"shape": [1], "dtype": "float32", "sha256": "0"}}}
    assert check_entry(good, "x") is good
    for bad in (None, [], {**good, "saved": "no"}, {**good, "digest": "md5"}, {**good, "tensors": {"w": {"shape": [1]}}}):
        with pytest.raises(CheckpointError, match=r"^x: its 'frozen' entry is not") as e:
            check_entry(bad, "x")
        assert "\n" not in str(e.value)
