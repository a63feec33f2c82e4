"""DeepSpeed ZeRO through treadle: the Trainer and a hand-written loop on 2 gloo processes
equal one process with the doubled batch at stages 1, 2 and 3; SIGKILLed mid-epoch and
resumed, they end bit for bit where an uninterrupted run ends; exports hold the final
weights. One-process runs (a process group of one) check the refusals.

Everything here runs on the CPU, a GPU machine included: the 2-process runs' children see
no GPU (support.run_ranks), so treadle gives DeepSpeed DS_ACCELERATOR=cpu there; the
one-process runs use backend="gloo" (a CPU device) and DS_ACCELERATOR=cpu (see
``one_process_group``). Skipped without the deepspeed package (treadle[deepspeed])."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import treadle
from support import TinyNet, make_data, run_ranks
from treadle.checkpoint.manifest import read_manifest
from treadle.checkpoint.weights import read_safetensors
from treadle.cli import main
from treadle.distributed import comm

from trainer_ranks import _final, _reference, _run

pytestmark = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,  # not imported: see one_process_group
                                reason="needs the deepspeed package: pip install 'treadle[deepspeed]'")

LOOP = str(Path(__file__).parent / "custom_loop_script.py")
# One process on the CPU (as the 2-process runs are): "gloo" makes a process-group strategy's device the CPU.
ON_CPU_DS = dict(type="deepspeed", backend="gloo")
# bf16 weights hold 8 bits of mantissa (weights of about 0.5 are 2e-3 apart), and 12 steps
# of SGD with momentum carry the rounding on: measured 1.8e-2 at most, against weights that
# moved by more than 0.2 from where they started.
BF16_ATOL = 3e-2


@pytest.fixture(scope="module")
def one_process_group():
    """DeepSpeed needs a process group: on one process the strategy makes a group of one.
    Kept for this module's tests (DeepSpeed caches groups made from it), freed after them so
    that other tests see none. DeepSpeed picks its accelerator once per process, when it is
    first imported (on a GPU machine: CUDA, unless DS_ACCELERATOR says otherwise): the CPU
    one here, as these runs are on the CPU."""
    with pytest.MonkeyPatch.context() as m:
        m.setenv("DS_ACCELERATOR", "cpu")
        from deepspeed.accelerator import get_accelerator

        assert get_accelerator().device_name() == "cpu", "deepspeed was imported before, with another accelerator"
        yield
    comm.shutdown()


def _trainer(model, **kw):
    args = dict(train_dataloader=DataLoader(make_data(32), batch_size=4), loss_fn=nn.CrossEntropyLoss(),
                optimizer=dict(type="SGD", lr=0.1, momentum=0.9), max_epochs=2, seed=7, log_writers=(), progress=False,
                strategy=ON_CPU_DS)
    args.update(kw)
    return treadle.Trainer(model, **args)


def test_one_process_with_accumulation_equals_a_hand_written_loop(one_process_group, tmp_path, monkeypatch):
    """Also: nothing is compiled (DeepSpeed would build its shared-memory op, or FusedAdam,
    into TORCH_EXTENSIONS_DIR), and no filter of DeepSpeed's warnings is left behind."""
    import warnings

    filters = list(warnings.filters)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    torch.manual_seed(0)
    model = TinyNet()
    reference = TinyNet()
    reference.load_state_dict(model.state_dict())
    trainer = _trainer(model, accumulate=2, strategy=dict(ON_CPU_DS, zero_stage=2))
    assert type(trainer.optim_wrappers["default"]).__name__ == "DeepSpeedOptimWrapper"
    assert trainer.strategy.ds_config["gradient_clipping"] == 0.0
    trainer.fit()
    assert not (tmp_path / "extensions").exists()
    added = [f for f in warnings.filters if f not in filters]  # torch's own imports add some; none of treadle's
    silenced = ("`torch.distributed.all_gather_into_tensor` is deprecated", "`torch.jit.script_method` is deprecated")
    assert not [f for f in added if f[1] is not None and any(f[1].match(m) for m in silenced)], added
    opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    x, y = make_data(32).tensors
    for _ in range(2):
        for i in range(0, 32, 8):  # a window of 2 micro-batches of 4
            opt.zero_grad()
            for j in (i, i + 4):
                (nn.functional.cross_entropy(reference(x[j:j + 4]), y[j:j + 4]) / 2).backward()
            opt.step()
    for k, v in reference.state_dict().items():
        torch.testing.assert_close(model.state_dict()[k], v, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kw, message", [
    (dict(ema=dict(momentum=0.01)), "ema= is not supported with strategy='deepspeed'"),
    (dict(compile=True), "compile=True is not supported with strategy='deepspeed'"),
    (dict(clip_grad=dict(value=1.0)), "clip_grad={'value': 1.0}: DeepSpeed clips by norm only"),
    (dict(strategy=dict(ON_CPU_DS, config={"bf16": {"enabled": True}})),
     "config['bf16']['enabled']=True contradicts precision='32'"),
    (dict(precision="16", loss_scale=512.0), "loss_scale=512.0 under strategy='deepspeed': DeepSpeed scales fp16"),
])
def test_what_deepspeed_cannot_honour_is_refused_before_training(one_process_group, kw, message):
    with pytest.raises(ValueError) as e:
        _trainer(TinyNet(), **kw)
    assert message in str(e.value)


def test_a_checkpoint_resumes_only_under_the_strategy_that_saved_it(one_process_group, tmp_path):
    """A ZeRO partition is not a torch optimizer's state, nor the reverse: refused before
    anything is loaded, in both directions; the weights still load with load_from=."""
    from treadle.checkpoint.io import CheckpointError

    torch.manual_seed(0)
    _trainer(TinyNet(), work_dir=tmp_path / "ds", max_epochs=1).fit()
    _trainer(TinyNet(), work_dir=tmp_path / "single", max_epochs=1, strategy="single").fit()
    ds_ckpt, single_ckpt = (tmp_path / d / "checkpoints" / "epoch_0001" for d in ("ds", "single"))
    model = TinyNet()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"saved by DeepSpeed ZeRO \(stage 2\), not a torch optimizer's"):
        _trainer(model, strategy="single", resume=ds_ckpt, max_epochs=2).fit()
    # "single" trains on DEVICE (CUDA where present): compared on the CPU
    assert all(torch.equal(v.cpu(), before[k]) for k, v in model.state_dict().items())  # nothing was loaded
    with pytest.raises(CheckpointError, match=r"saved by another strategy; this run has ZeRO stage 2 on 1"):
        _trainer(TinyNet(), resume=single_ckpt, max_epochs=2).fit()
    loaded = TinyNet()
    _trainer(loaded, strategy="single", load_from=ds_ckpt, max_epochs=1)
    assert not all(torch.equal(v.cpu(), before[k]) for k, v in loaded.state_dict().items())


def test_async_save_is_written_synchronously_and_still_pruned(one_process_group, tmp_path, caplog):
    """checkpoint=dict(async_save=True): DeepSpeed's saves are synchronous (each rank writes
    its partition), said once; the hook saves synchronously and prunes to keep=1."""
    from treadle.checkpoint.weights import read_weights

    torch.manual_seed(0)
    model = TinyNet()
    _trainer(model, work_dir=tmp_path, max_epochs=3, checkpoint=dict(interval=1, async_save=True, keep=1)).fit()
    assert "DeepSpeed's checkpoints are written synchronously" in caplog.text
    assert "writing in the background" not in caplog.text  # the hook saved synchronously (async_saves=False)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["epoch_0003"]
    saved = read_weights(tmp_path / "checkpoints" / "epoch_0003")
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())


def test_a_checkpoint_inside_an_accumulation_window_restarts_the_window(one_process_group, tmp_path, caplog):
    """The window's partial gradients live in ZeRO's buffers: not saved (said), and the
    checkpoint resumes with a fresh window."""
    torch.manual_seed(0)
    _trainer(TinyNet(), work_dir=tmp_path, max_epochs=None, max_iters=3, accumulate=2,
             checkpoint=dict(interval=1, by_epoch=False, keep=None)).fit()
    assert "checkpoint inside an accumulation window of optimizer 'default': its partial gradients are not " \
           "saved under strategy 'deepspeed'" in caplog.text
    saved = torch.load(tmp_path / "checkpoints" / "iter_00000001" / "state.pt", weights_only=True)
    assert saved["optim"]["default"]["micro_step"] == 0  # after 1 of 2 micro-batches
    own = torch.load(tmp_path / "checkpoints" / "iter_00000001" / "rng_rank0.pt", weights_only=True)
    assert "grads" not in own["rank_state"]["optim"]["default"] and "zero" in own["rank_state"]["optim"]["default"]
    resumed = _trainer(TinyNet(), work_dir=tmp_path, max_epochs=None, max_iters=4, accumulate=2,
                       resume=tmp_path / "checkpoints" / "iter_00000001")
    resumed.fit()
    assert resumed.state.iter == 4


def test_two_optimizers_are_refused(one_process_group):
    strategy = treadle.build_strategy(ON_CPU_DS)
    model = nn.ModuleDict({"gen": nn.Linear(2, 2), "disc": nn.Linear(2, 1)})
    with pytest.raises(ValueError, match=r"strategy='deepspeed' trains one optimizer; got \['disc', 'gen'\]"):
        strategy.prepare(model, optim_wrapper={"gen": dict(optimizer=dict(type="SGD", lr=0.1)),
                                               "disc": dict(optimizer=dict(type="SGD", lr=0.1))})


def test_a_new_group_after_shutdown_serves_a_second_deepspeed_run(one_process_group):
    """comm.shutdown() destroys the group through DeepSpeed, which forgets its clone of
    the world group: with torch's destroy alone the second run failed with "Group ... is
    not registered" (its ZeRO optimizer used the dead clone)."""
    first = _trainer(TinyNet(), max_epochs=1)
    first.fit()
    comm.shutdown()
    second = _trainer(TinyNet(), max_epochs=1)  # the strategy makes a new group of one
    second.fit()
    assert second.state.iter == first.state.iter == 8
    for p in second.module.parameters():
        assert torch.isfinite(p).all()


@pytest.mark.slow  # 2 processes on gloo
@pytest.mark.parametrize("stage", ["1", "2", "3"])
def test_trainer_on_two_processes_equals_one_with_the_doubled_batch(tmp_path, stage):
    out, work = tmp_path / "out", tmp_path / "run"
    _run(out, "--strategy", "deepspeed", "--zero-stage", stage, "--shuffle", "--accumulate", "2",
         "--work-dir", str(work), "--val")
    final = _final(out)
    for k, v in _reference(shuffle=True, accumulate=2).items():
        torch.testing.assert_close(final[k], v, rtol=1e-5, atol=1e-6)
    # Validation: 19 + 18 samples on the ranks, each counted once (stage 3: in lockstep, its
    # forward gathers the partitioned parameters).
    model = TinyNet()
    model.load_state_dict(final)
    x, y = make_data(37, seed=1).tensors
    with torch.no_grad():
        logits = model(x)
    metrics = torch.load(out / "result_rank0.pt", weights_only=True)["metrics"]
    assert metrics["val/acc"] == pytest.approx((logits.argmax(1) == y).float().mean().item())
    assert metrics["val/loss"] == pytest.approx(nn.functional.cross_entropy(logits, y).item(), rel=1e-5)
    ckpt = work / "checkpoints" / "epoch_0002"
    assert main(["export", str(ckpt), "--out", str(tmp_path / "model.safetensors")]) == 0  # `treadle export`
    exported = read_safetensors(tmp_path / "model.safetensors")
    assert exported.keys() == final.keys() and all(torch.equal(exported[k], final[k]) for k in final)
    manifest = read_manifest(ckpt)  # every rank wrote its own file (nothing gathered); the manifest covers them
    assert {"state.pt", "rng_rank0.pt", "rng_rank1.pt"} <= set(manifest["files"]) and "dcp" not in manifest
    for rank in (0, 1):  # each rank's file holds its own ZeRO partition, read with weights_only
        own = torch.load(ckpt / f"rng_rank{rank}.pt", weights_only=True)["rank_state"]["optim"]["default"]["zero"]
        assert own["zero_stage"] == int(stage) and own["partition_count"] in (2, [2])


@pytest.mark.slow
def test_bf16_trains_within_its_tolerance(tmp_path):
    _run(tmp_path / "out", "--strategy", "deepspeed", "--zero-stage", "2", "--precision", "bf16", "--shuffle")
    final = _final(tmp_path / "out")
    assert all(v.dtype == torch.bfloat16 for v in final.values())  # DeepSpeed's bf16: the module is bf16
    torch.manual_seed(0)
    start = TinyNet().state_dict()
    reference = _reference(shuffle=True, accumulate=1)
    assert max((v - start[k]).abs().max().item() for k, v in reference.items()) > 0.2  # the tolerance means something
    for k, v in reference.items():
        torch.testing.assert_close(final[k].float(), v, rtol=0, atol=BF16_ATOL)


@pytest.mark.slow
@pytest.mark.parametrize("stage, precision", [("3", "32"), ("1", "bf16")])
def test_sigkill_mid_epoch_then_resume_equals_an_uninterrupted_run(tmp_path, stage, precision):
    common = ["--strategy", "deepspeed", "--zero-stage", stage, "--precision", precision, "--shuffle",
              "--dropout", "0.3", "--interval", "2"]
    _run(tmp_path / "a", "--work-dir", str(tmp_path / "wa"), *common)
    results = _run(tmp_path / "b", "--work-dir", str(tmp_path / "wb"), *common, "--kill-at", "9", expect=None)
    assert results[1][0] == -9 and results[0][0] != 0
    _run(tmp_path / "b", "--work-dir", str(tmp_path / "wb"), *common, "--resume")  # from iter 8, mid-epoch 2
    assert torch.load(tmp_path / "b" / "result_rank0.pt", weights_only=True)["resumed_at"] == 8
    a, b = _final(tmp_path / "a"), _final(tmp_path / "b")
    for k in a:
        assert torch.equal(a[k], b[k]), k


def _loop(strategy: str, work: Path, out: Path, *args: str, expect: int = 0) -> dict:
    for rank, (code, output) in enumerate(run_ranks(LOOP, [strategy, str(work), str(out), *args], timeout=300)):
        assert code == expect, f"rank {rank} exited {code}:\n{output[-4000:]}"
    return torch.load(out, weights_only=True) if expect == 0 else {}


@pytest.mark.slow
def test_hand_written_loop_equals_ddp_and_resumes_exactly_after_sigkill(tmp_path):
    """tests/strategies/custom_loop_script.py (build_strategy, prepare, save_checkpoint,
    load_or_resume) with ZeRO-3: the weights DDP reaches (proven equal to one process in
    test_ddp.py), and after a SIGKILL and a resume the same weights, fp32 masters and
    Adam moments bit for bit."""
    ddp = _loop("ddp", tmp_path / "ddp", tmp_path / "ddp.pt", "--save-every", "4")
    a = _loop("deepspeed3", tmp_path / "a", tmp_path / "a.pt", "--save-every", "4")
    for k, v in ddp["weights"].items():
        torch.testing.assert_close(a["weights"][k], v, rtol=1e-5, atol=1e-6)
    _loop("deepspeed3", tmp_path / "b", tmp_path / "b.pt", "--save-every", "4", "--kill-at", "7", expect=-9)
    b = _loop("deepspeed3", tmp_path / "b", tmp_path / "b.pt", "--save-every", "4")  # resumes iter 4
    assert a["iter"] == b["iter"] == 36
    assert all(torch.equal(a["weights"][k], b["weights"][k]) for k in a["weights"])
    for i, entries in a["optim_state"].items():
        for key, t in entries.items():
            assert torch.equal(t, b["optim_state"][i][key]), (i, key)


def test_a_hugging_face_model_s_checkpoint_exports_as_a_folder(one_process_group, tmp_path):
    """The checkpoint of a DeepSpeed run records the model as the others do: the folder loads
    to the trained weights bit for bit."""
    transformers = pytest.importorskip("transformers")
    from export_support import TokenBatches, llama
    from treadle.checkpoint.hf_export import export_folder
    from treadle.checkpoint.io import find_latest_checkpoint

    trainer = _trainer(llama(tied=True), train_dataloader=DataLoader(TokenBatches(), batch_size=4), loss_fn=None,
                       max_epochs=None, max_iters=2, work_dir=tmp_path / "ds",
                       checkpoint=dict(interval=2, by_epoch=False))
    trainer.fit()
    export_folder(find_latest_checkpoint(tmp_path / "ds" / "checkpoints"), tmp_path / "out")
    loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "out").state_dict()
    trained = trainer.module.state_dict()
    assert set(loaded) == set(trained) and all(torch.equal(loaded[k], v.cpu()) for k, v in trained.items())


@pytest.mark.parametrize("stage", [2, 3])
def test_frozen_weights_are_left_out_and_a_resume_checks_their_digests(one_process_group, tmp_path, stage,
                                                                       monkeypatch):
    """As under the other strategies (test_frozen_weights.py): the frozen layer's weights
    are not in the checkpoint's model entry, a resume over the same ones ends where the
    uninterrupted run ends, over other ones it is refused naming the first that differs.
    Stage 3: the digests are made from the gathered weights (once per run)."""
    from treadle.checkpoint.io import CheckpointError, load_checkpoint

    # ZeRO-3 replaces torch.nn.functional.linear for the rest of the process ("unless manually
    # reset", DeepSpeed says): put back after this test, as the other tests call the real one.
    monkeypatch.setattr(torch.nn.functional, "linear", torch.nn.functional.linear)

    def frozen_net(seed: int = 0) -> nn.Module:
        torch.manual_seed(seed)
        net = TinyNet()
        net.fc1.requires_grad_(False)
        return net

    strategy = dict(ON_CPU_DS, zero_stage=stage)
    whole = _trainer(frozen_net(), work_dir=tmp_path / "whole", strategy=strategy,
                     checkpoint=dict(interval=5, by_epoch=False, keep=None))
    whole.fit()
    saved = tmp_path / "whole" / "checkpoints" / "iter_00000005"
    state = load_checkpoint(saved, files=["state.pt"])["state.pt"]
    assert sorted(state["model"]) == ["fc2.bias", "fc2.weight"]
    assert list(state["frozen"]["tensors"]) == ["fc1.weight", "fc1.bias"]
    resumed = _trainer(frozen_net(), work_dir=tmp_path / "b", strategy=strategy, resume=saved)
    resumed.fit()
    final = whole.strategy.model_state_dict()
    for k, v in resumed.strategy.model_state_dict().items():
        assert torch.equal(v, final[k]), k
    with pytest.raises(CheckpointError, match=r"^resume refused, nothing was loaded: frozen weight 'fc1.weight' "
                                              r"differs \(sha256 "):
        _trainer(frozen_net(seed=1), work_dir=tmp_path / "c", strategy=strategy, resume=saved).fit()
