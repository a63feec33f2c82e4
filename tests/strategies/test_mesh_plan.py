"""The mesh's shape and the tensor-parallel plan, checked in one process: sizes against
the world size, ranks and data groups, plans against the model (patterns, styles,
divisibility, tied weights, attention heads, a Hugging Face model's own plan), the
strategy's arguments, and clipping by norm across meshes against torch's own."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import treadle
from support import TINY_LM_PLAN, TinyLM, tiny_llama
from treadle.optim.clip import clip_grad_norm_meshes
from treadle.strategies.build import resolve_strategy
from treadle.distributed.layout import MeshShape
from treadle.strategies.tensor_parallel import model_plan, resolve_plan


@pytest.mark.parametrize("given, world, want", [
    (dict(), 4, (1, 4, 1)),
    (dict(tp=2), 4, (1, 2, 2)),
    (dict(dp_replicate=2), 8, (2, 4, 1)),
    (dict(dp_replicate=2, tp=2), 8, (2, 2, 2)),
    (dict(dp_shard=1, tp=2), 2, (1, 1, 2)),
    (dict(), 1, (1, 1, 1)),
    (dict(dp_replicate=-1, dp_shard=2), 8, (4, 2, 1)),
    (dict(dp_replicate=-1, dp_shard="node"), 16, (2, 8, 1)),      # 8 processes per node: shards within one
    (dict(dp_replicate=-1, dp_shard="node", tp=2), 16, (2, 4, 2)),
])
def test_minus_one_takes_what_is_left(given, world, want):
    shape = MeshShape(**given).resolve(world, local_world_size=8)
    assert (shape.dp_replicate, shape.dp_shard, shape.tp) == want


def test_ranks_lie_row_major_with_tensor_parallel_innermost():
    shape = MeshShape(dp_replicate=2, dp_shard=2, tp=2).resolve(8)
    assert shape.dp_size == 4
    assert [shape.dp_rank(r) for r in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [shape.tp_rank(r) for r in range(8)] == [0, 1] * 4
    assert shape.dp_groups() == [[0, 2, 4, 6], [1, 3, 5, 7]]  # one per tp index: the ranks whose batches differ
    assert shape.describe() == "2 replicas x 2 shards x tp 2 (8 processes)"


@pytest.mark.parametrize("given, world, message", [
    (dict(dp_replicate=2, dp_shard=2, tp=2), 4, "dp_replicate=2 x dp_shard=2 x tp=2 = 8 process(es), but this job has 4"),
    (dict(tp=3), 4, "dp_replicate=1 x tp=3 = 3 does not divide the 4 process(es)"),
    (dict(tp=2), 1, "dp_replicate=1 x tp=2 = 2 does not divide the 1 process(es)"),
    (dict(dp_replicate=-1, dp_shard=3), 4, "dp_shard=3 x tp=1 = 3 does not divide the 4 process(es)"),
])
def test_a_shape_that_is_not_the_world_size_is_one_line(given, world, message):
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")) as info:
        MeshShape(**given).resolve(world)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("key, value", [("tp", 0), ("dp_replicate", -2), ("dp_shard", 0), ("tp", 1.5), ("tp", True),
                                        ("dp_shard", "nodes"), ("tp", -1)])
def test_sizes_are_positive_ints(key, value):
    with pytest.raises(ValueError, match=f"^{key}={value!r}; expected a positive int"):
        MeshShape(**{key: value})
    with pytest.raises(ValueError, match="^dp_replicate=-1 and dp_shard=-1; expected at most one of them"):
        MeshShape(dp_replicate=-1)


def test_the_strategy_takes_the_mesh_keys_from_a_dict():
    s = resolve_strategy(dict(type="fsdp", dp_replicate=1, dp_shard=-1, tp=2, tp_plan={"layers.*.up": "colwise"}))
    assert (s.shape.tp, s.tp_plan) == (2, {"layers.*.up": "colwise"})
    with pytest.raises(ValueError, match=r"^strategy 'fsdp': tp=2 needs tp_plan=: a dict"):
        resolve_strategy(dict(type="fsdp", tp=2))
    with pytest.raises(ValueError, match=r"tp_plan\['layers.\*.up'\]='colwize' is not a style treadle knows "
                                         r"\(did you mean 'colwise'\?\)"):
        resolve_strategy(dict(type="fsdp", tp=2, tp_plan={"layers.*.up": "colwize"}))
    with pytest.raises(TypeError, match=r"tp_plan=\['up'\]; expected a dict"):
        resolve_strategy(dict(type="fsdp", tp=2, tp_plan=["up"]))


def test_a_mesh_larger_than_the_job_stops_the_trainer_in_one_line():
    with pytest.raises(ValueError, match=r"dp_replicate=1 x tp=2 = 2 does not divide the 1 process\(es\) of this job"):
        treadle.Trainer(TinyLM(), strategy=dict(type="fsdp", tp=2, tp_plan=TINY_LM_PLAN))


def test_a_plans_names_are_checked_on_one_process_too():
    """tp=1 splits nothing (a warning says so), but a typo in the plan shows before a cluster runs it."""
    with pytest.raises(ValueError, match=r"^tp_plan: 'layers.\*.atn.q_proj' matches no module of TinyLM"):
        treadle.Trainer(TinyLM(), strategy=dict(type="fsdp", tp_plan={"layers.*.atn.q_proj": "colwise"}))


def test_a_plan_resolves_to_module_names_and_styles():
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    resolved = resolve_plan(TinyLM(), {**TINY_LM_PLAN, "head": "colwise_rep", "norm": "replicate"}, tp=2)
    assert sorted(resolved) == sorted(["embed", "head", *[f"layers.{i}.{m}" for i in range(2) for m in (
        "attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj", "up", "down")]])  # "replicate": left alone
    assert isinstance(resolved["layers.1.attn.q_proj"], ColwiseParallel)
    assert isinstance(resolved["layers.0.down"], RowwiseParallel)
    assert isinstance(resolved["embed"], RowwiseParallel)  # embedding_rowwise: split on the vocabulary


@pytest.mark.parametrize("plan, message", [
    ({"layers.*.attn.qproj": "colwise"}, r"tp_plan: 'layers.\*.attn.qproj' matches no module of TinyLM; did you mean "
                                         r"'layers.\*.attn.q_proj'"),
    ({"layers.*.up": "colwise", "layers.0.up": "rowwise"}, r"tp_plan: module 'layers.0.up' matches 'layers.\*.up' "
                                                          r"and 'layers.0.up', with different styles"),
    ({"layers.*.norm1": "colwise"}, r"tp_plan\['layers.0.norm1'\]='colwise': the module is a LayerNorm"),
    ({"head": "colwise"}, r"tp_plan: tp=3 does not divide head.out_features=64, which 'colwise' splits"),
])
def test_plan_errors_name_the_pattern_and_what_was_expected(plan, message):
    tp = 3 if "head" in plan else 2
    with pytest.raises(ValueError, match="^" + message) as info:
        resolve_plan(TinyLM(), plan, tp=tp)
    assert "\n" not in str(info.value)


def test_a_split_module_with_a_tied_weight_is_refused():
    model = TinyLM()
    model.head.weight = model.embed.weight  # tied input and output embeddings
    with pytest.raises(ValueError, match=r"tp_plan: embed.weight and head.weight are one tied parameter, and the plan "
                                         r"splits 'head'; untie them"):
        resolve_plan(model, {"head": "colwise_rep"}, tp=2)
    resolve_plan(model, {"layers.*.up": "colwise"}, tp=2)  # the tied modules left out: fine


def test_auto_is_a_hugging_face_models_own_plan():
    pytest.importorskip("transformers")
    model = tiny_llama()
    plan = model_plan(model)
    assert plan["model.layers.*.self_attn.q_proj"] == "colwise"
    assert plan["model.layers.*.self_attn.o_proj"] == "rowwise"
    resolved = resolve_plan(model, plan, tp=2)
    assert "model.layers.1.mlp.down_proj" in resolved
    with pytest.raises(ValueError, match=r"tp=4 does not divide the model's num_key_value_heads=2; each tp rank "
                                         r"computes whole heads"):
        resolve_plan(model, plan, tp=4)


@pytest.mark.parametrize("style, why", [("moe_tp_experts", "mixture-of-experts experts (moe_tp_experts) are not "
                                                           "split yet"),
                                        ("packed_colwise", "packed projections (packed_*: several projections in "
                                                           "one weight) are not split yet")])
def test_auto_with_a_style_treadle_does_not_apply_names_it_and_why(style, why):
    model = TinyLM()
    model.tp_plan = {"layers.*.up": style}  # as a Hugging Face mixture-of-experts (or packed) model's plan
    with pytest.raises(ValueError, match=r"^tp_plan='auto': the model's plan gives 'layers.\*.up' the style "
                                         rf"'{style}', which treadle does not apply") as e:
        resolve_plan(model, model_plan(model), tp=2, source="tp_plan='auto'")
    assert f"({why}; fused projections a plain style splits, such as colwise_gather_output, are)" in str(e.value)
    assert "fused projections are not split" not in str(e.value)


def test_per_head_norms_of_qwen3_get_their_gradients_summed():
    pytest.importorskip("transformers")
    from support import tiny_qwen3

    plan = model_plan(tiny_qwen3())
    assert plan["model.layers.*.self_attn.q_norm"] == "replicated_with_grad_allreduce"
    assert "model.layers.0.self_attn.k_norm" in resolve_plan(tiny_qwen3(), plan, tp=2)


def test_auto_on_a_model_without_a_plan_says_what_to_pass():
    with pytest.raises(ValueError, match=r"^tp_plan='auto': TinyLM has no tensor-parallel plan of its own"):
        model_plan(TinyLM())


def test_clipping_across_meshes_equals_torchs_on_plain_tensors():
    torch.manual_seed(0)
    grads = [torch.randn(5, 3), torch.randn(7), torch.randn(2, 2) * 10]
    mine = [nn.Parameter(torch.zeros_like(g)) for g in grads]
    theirs = [nn.Parameter(torch.zeros_like(g)) for g in grads]
    for p, q, g in zip(mine, theirs, grads):
        p.grad, q.grad = g.clone(), g.clone()
    for norm_type in (2.0, 1.0, float("inf")):
        total = clip_grad_norm_meshes(mine, 0.5, norm_type)
        want = torch.nn.utils.clip_grad_norm_(theirs, 0.5, norm_type)
        assert torch.equal(total, want)
        assert all(torch.equal(p.grad, q.grad) for p, q in zip(mine, theirs))
    mine[0].grad[0, 0] = float("nan")
    with pytest.raises(RuntimeError, match="non-finite"):
        clip_grad_norm_meshes(mine, 0.5, error_if_nonfinite=True)


def test_a_user_plan_that_contradicts_the_models_own_is_warned_naming_the_module_and_both_styles(caplog):
    """Phi-3's own plan gathers the output of its fused gate_up_proj (colwise_gather_output);
    a user's plan that gives it plain colwise trains wrong without an error: one warning
    names the module and both styles. Aliases of one layout and modules the model's plan
    leaves out are no contradiction."""
    pytest.importorskip("transformers")
    import logging

    from transformers import Phi3Config, Phi3ForCausalLM

    from treadle.strategies.tensor_parallel import warn_if_contradicting

    model = Phi3ForCausalLM(Phi3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=16,
                                       pad_token_id=0, tie_word_embeddings=False))
    plan = {"model.layers.*.self_attn.qkv_proj": "colwise_rep", "model.layers.*.self_attn.o_proj": "rowwise_rep",
            "model.layers.*.mlp.gate_up_proj": "colwise", "model.layers.*.mlp.down_proj": "rowwise_split_input",
            "lm_head": "colwise_rep"}
    with caplog.at_level(logging.WARNING, logger="treadle"):
        text = warn_if_contradicting(model, plan)
    assert text is not None and [r.getMessage() for r in caplog.records if r.name == "treadle"] == [text]
    assert "model.layers.*.mlp.gate_up_proj: 'colwise' where the model's plan says 'colwise_gather_output'" in text
    assert "qkv_proj" not in text and "o_proj" not in text and "lm_head" not in text, text  # aliases; not in its plan
    own = {k: v for k, v in plan.items() if "gate_up" not in k}
    assert warn_if_contradicting(model, {**own, "model.layers.*.mlp.gate_up_proj": "colwise_gather_output"}) is None
    assert warn_if_contradicting(TinyLM(), TINY_LM_PLAN) is None  # a model without a plan of its own
