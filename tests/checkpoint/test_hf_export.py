"""``treadle export CKPT --out DIR``: a Hugging Face folder that ``from_pretrained`` loads to
the trained weights bit for bit, as ``save_pretrained`` writes it; frozen weights the
checkpoint left out read from the base; errors in one line."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from cli_support import run
from export_support import TokenBatches, llama, logits, train_and_save
from treadle.checkpoint.hf_export import ExportError, export_folder
from treadle.checkpoint.io import load_checkpoint

transformers = pytest.importorskip("transformers")


def _weights(folder):
    index = folder / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    out = {}
    for name in files:
        out.update(load_file(folder / name))
    return out


def _assert_same_weights(model, folder):
    loaded = transformers.LlamaForCausalLM.from_pretrained(folder)
    theirs, ours = loaded.state_dict(), model.state_dict()
    assert set(theirs) == set(ours)
    for k, v in ours.items():
        assert theirs[k].dtype == v.dtype and torch.equal(theirs[k], v), k
    return loaded


def test_the_folder_loads_bit_for_bit_and_is_what_save_pretrained_writes(tmp_path):
    model = train_and_save(llama(tied=True), tmp_path / "ckpt")
    export_folder(tmp_path / "ckpt", tmp_path / "out")
    loaded = _assert_same_weights(model, tmp_path / "out")
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight  # still tied
    model.save_pretrained(tmp_path / "ref")  # transformers' own folder of the same weights
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(p.name for p in (tmp_path / "ref").iterdir())
    for name in ("config.json", "generation_config.json"):
        assert json.loads((tmp_path / "out" / name).read_text()) == json.loads((tmp_path / "ref" / name).read_text())
    ours, theirs = _weights(tmp_path / "out"), _weights(tmp_path / "ref")
    assert set(ours) == set(theirs) and "lm_head.weight" not in ours  # the tied alias dropped, as there
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_shards_and_their_index_are_save_pretrained_s(tmp_path):
    model = train_and_save(llama(tied=False), tmp_path / "ckpt")
    export_folder(tmp_path / "ckpt", tmp_path / "out", max_shard_size="20KB")
    model.save_pretrained(tmp_path / "ref", max_shard_size="20KB")
    ours = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    theirs = json.loads((tmp_path / "ref" / "model.safetensors.index.json").read_text())
    assert len(set(ours["weight_map"].values())) > 2
    assert ours["weight_map"] == theirs["weight_map"]
    assert ours["metadata"]["total_size"] == theirs["metadata"]["total_size"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(p.name for p in (tmp_path / "ref").iterdir())
    _assert_same_weights(model, tmp_path / "out")


def test_a_sharded_dcp_checkpoint_exports_tensor_by_tensor(tmp_path):
    from treadle.checkpoint.model_info import describe_model
    from treadle.checkpoint.sharded import save_sharded

    model = llama(tied=True, seed=4)
    save_sharded(tmp_path / "ckpt", {"model": model.state_dict()}, {"state.pt": {"iter": 0}},
                 {"model": describe_model(model)})
    export_folder(tmp_path / "ckpt", tmp_path / "out", max_shard_size="30KB")
    _assert_same_weights(model, tmp_path / "out")


def _frozen_run(tmp_path, model):
    """``model`` with its embeddings and first layer frozen, trained and saved without them."""
    for name, p in model.named_parameters():
        p.requires_grad = not name.startswith(("model.embed_tokens", "model.layers.0."))
    frozen = {k: v.clone() for k, v in model.state_dict().items()}
    model = train_and_save(model, tmp_path / "ckpt")
    saved = load_checkpoint(tmp_path / "ckpt", files=["state.pt"])["state.pt"]["model"]
    assert "model.embed_tokens.weight" not in saved and "model.layers.1.mlp.up_proj.weight" in saved
    assert torch.equal(model.state_dict()["model.layers.0.mlp.up_proj.weight"], frozen["model.layers.0.mlp.up_proj.weight"])
    return model


def test_frozen_weights_left_out_are_read_from_the_folder_the_model_came_from(tmp_path):
    llama(tied=False, seed=1).save_pretrained(tmp_path / "base")
    model = _frozen_run(tmp_path, transformers.LlamaForCausalLM.from_pretrained(tmp_path / "base"))
    export_folder(tmp_path / "ckpt", tmp_path / "out")  # the base: where the model was loaded from
    _assert_same_weights(model, tmp_path / "out")
    export_folder(tmp_path / "ckpt", tmp_path / "out2", base=tmp_path / "base")  # or named
    _assert_same_weights(model, tmp_path / "out2")


def test_a_base_of_other_shapes_or_none_is_refused_in_one_line(tmp_path):
    model = _frozen_run(tmp_path, llama(tied=False, seed=1))  # built from a config: no folder to read
    with pytest.raises(ExportError) as e:
        export_folder(tmp_path / "ckpt", tmp_path / "out")
    frozen = sum(not p.requires_grad for p in model.parameters())  # the embeddings and layer 0's 9
    assert frozen == 10 and str(e.value) == (f"{tmp_path / 'ckpt'} leaves out 10 of the model's weights (frozen ones, e.g. "
                            "'model.embed_tokens.weight'); they are read from the base model: pass --base DIR (a "
                            "folder save_pretrained wrote)")
    other = llama(tied=False)
    other.resize_token_embeddings(80)
    other.save_pretrained(tmp_path / "other")
    with pytest.raises(ExportError) as e:
        export_folder(tmp_path / "ckpt", tmp_path / "out", base=tmp_path / "other")
    assert str(e.value) == (f"--base {tmp_path / 'other'}: tensor 'model.embed_tokens.weight' has shape (80, 32), the "
                            "model's is (64, 32); it is not this model's base")
    assert not (tmp_path / "out").exists() and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    model.save_pretrained(tmp_path / "same")  # the right base: the trained model's own folder holds them too
    export_folder(tmp_path / "ckpt", tmp_path / "out", base=tmp_path / "same")
    _assert_same_weights(model, tmp_path / "out")


def test_the_ema_weights_export_as_a_folder(tmp_path, capsys):
    import treadle

    model = llama(tied=False)
    trainer = treadle.Trainer(model, work_dir=tmp_path / "run", train_dataloader=torch.utils.data.DataLoader(
        TokenBatches(), batch_size=4), optimizer=dict(type="AdamW", lr=1e-2), max_iters=4, seed=0,
        ema=dict(momentum=0.5), checkpoint=dict(interval=4, by_epoch=False), log_interval=100)
    trainer.fit()
    from treadle.checkpoint.io import find_latest_checkpoint

    state = load_checkpoint(find_latest_checkpoint(tmp_path / "run" / "checkpoints"), files=["state.pt"])["state.pt"]
    ema = state["hooks"]["EMAHook"]["ema"]["module"]
    rc, out, err = run(capsys, "export", tmp_path / "run", "--ema", "--out", tmp_path / "ema")
    assert rc == 0, err
    loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "ema").state_dict()
    assert set(loaded) == set(ema) and all(torch.equal(loaded[k], ema[k]) for k in ema)
    assert any(not torch.equal(ema[k], v) for k, v in model.state_dict().items())  # not the model's own


def test_the_command_line(tmp_path, capsys):
    model = train_and_save(llama(tied=True), tmp_path / "ckpt")
    (tmp_path / "out").mkdir()  # an empty folder is written in place
    rc, out, err = run(capsys, "export", tmp_path / "ckpt", "--out", tmp_path / "out", "--max-shard-size", "20KB")
    assert rc == 0 and out.strip() == str(tmp_path / "out"), err
    assert len(list((tmp_path / "out").glob("model-0000*-of-0000*.safetensors"))) > 2
    assert torch.equal(logits(model), logits(transformers.LlamaForCausalLM.from_pretrained(tmp_path / "out")))
    capsys.readouterr()  # transformers' progress bar
    for argv, error in [(["--out", tmp_path / "x", "--max-shard-size", "lots"],
                         "--max-shard-size 'lots' is not a size; expected bytes or a number with a unit"),
                        (["--out", tmp_path / "x", "--merge"], f"--merge: {tmp_path / 'ckpt'} holds no PEFT model"),
                        (["--out", tmp_path / "out"], f"--out {tmp_path / 'out'}: the folder exists and is not empty")]:
        rc, out, err = run(capsys, "export", tmp_path / "ckpt", *argv)
        assert rc == 2 and error in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "x").exists()
