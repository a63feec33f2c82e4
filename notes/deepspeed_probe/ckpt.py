"""Checkpoint probe. torchrun --nproc-per-node 2 ckpt.py --stage S [--bf16] --phase full|save|resume_ds|resume_own

full:       train 10 steps straight, write out/<name>_full.pt (weights, fp32 masters, optimizer states)
save:       train 6 steps, engine.save_checkpoint(ck/<name>, "t6") and own per-rank files own/<name>/rank<r>.pt,
            then train 4 more (must equal full)
resume_ds:  fresh engine, engine.load_checkpoint(ck/<name>, "t6"), train 4 -> out/<name>_resume_ds.pt
resume_own: fresh engine, load own files (no DeepSpeed reader), train 4 -> out/<name>_resume_own.pt
"""
import argparse
import io
import json
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
from torch import nn  # noqa: E402

from common import make_data, make_model, micro  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--stage", type=int, default=1)
p.add_argument("--persist0", action="store_true", help="stage3_param_persistence_threshold=0: really partition tiny params")
p.add_argument("--bf16", action="store_true")
p.add_argument("--fp16", action="store_true")
p.add_argument("--gas", type=int, default=2)
p.add_argument("--phase", default="full")
p.add_argument("--sched", action="store_true", help="DeepSpeed-owned WarmupLR scheduler in the config")
a = p.parse_args()
name = f"s{a.stage}_{'bf16' if a.bf16 else 'fp16' if a.fp16 else 'fp32'}_gas{a.gas}{'_sched' if a.sched else ''}{'_p0' if a.persist0 else ''}"
warnings.simplefilter("ignore")
if os.environ.get("TRACEWARN"):
    import warntrace  # noqa: F401

import deepspeed  # noqa: E402
import deepspeed.ops  # noqa: E402

deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False

STEPS, SAVE_AT = 10, 6
rank = int(os.environ["RANK"])
model = make_model()
cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": a.gas,
       "zero_optimization": {"stage": a.stage}, "zero_allow_untested_optimizer": True,
       "gradient_clipping": 0.5, "steps_per_print": 10**9}
if a.persist0:
    cfg["zero_optimization"]["stage3_param_persistence_threshold"] = 0
if a.bf16:
    cfg["bf16"] = {"enabled": True}
if a.fp16:
    cfg["fp16"] = {"enabled": True, "initial_scale_power": 4, "loss_scale_window": 2}
if a.sched:
    cfg["scheduler"] = {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 1e-2, "warmup_num_steps": 8}}
opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
engine, _, _, sched = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
dtype = torch.bfloat16 if a.bf16 else torch.float16 if a.fp16 else torch.float32
X, Y = make_data(STEPS, a.gas)


def train(lo, hi):
    for s in range(lo, hi):
        for m in range(a.gas):
            x, y = micro(X, Y, s, m, a.gas, rank)
            loss = nn.functional.mse_loss(engine(x.to(dtype)).float(), y)
            engine.backward(loss)
            engine.step()


def snapshot():
    """Everything that must match: full weights, this rank's fp32 master partition, optimizer state."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state
    out = {}
    params = dict(engine.module.named_parameters())
    for n, prm in params.items():
        out["fp32/" + n] = safe_get_full_fp32_param(prm).clone()  # a collective under ZeRO-3
        for key in ("exp_avg", "exp_avg_sq"):
            out[f"{key}/{n}"] = safe_get_full_optimizer_state(prm, key).clone()
    if a.stage == 3:
        with deepspeed.zero.GatheredParameters(list(params.values()), modifier_rank=None):
            out.update({"w/" + k: v.detach().clone() for k, v in engine.module.state_dict().items()})
    else:
        out.update({"w/" + k: v.detach().clone() for k, v in engine.module.state_dict().items()})
    out["counters"] = torch.tensor([engine.global_steps, engine.global_samples, engine.skipped_steps])
    if a.fp16:
        out["loss_scale"] = torch.tensor(float(engine.optimizer.loss_scaler.cur_scale))
    if sched is not None:
        out["lr"] = torch.tensor(sched.get_last_lr())
    return out


def weights_only_globals(obj):
    """torch.save(obj) then torch.load(weights_only=True), collecting the globals it refuses."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    needed = []
    while True:
        buf.seek(0)
        try:
            with torch.serialization.safe_globals(needed):
                torch.load(buf, weights_only=True)
            return [f"{g.__module__}.{g.__qualname__}" for g in needed]
        except Exception as e:  # pickle.UnpicklingError
            msg = str(e)
            import re
            m = re.search(r"Unsupported global: GLOBAL ([\w\.]+)", msg)
            if not m:
                return [f"<other error: {msg[:300]}>"]
            modname, _, attr = m.group(1).rpartition(".")
            import importlib
            needed.append(getattr(importlib.import_module(modname), attr))


ck = f"/tmp/ds_probe/ck/{name}"
own = f"/tmp/ds_probe/own/{name}"
if a.phase == "full":
    train(0, STEPS)
    snap = snapshot()
    if rank == 0:
        torch.save(snap, f"/tmp/ds_probe/out/{name}_full.pt")
elif a.phase == "save":
    train(0, SAVE_AT)
    engine.save_checkpoint(ck, tag="t6", client_state={"extra": 1})
    # own format: per-rank optimizer state, model state, counters
    osd = engine.optimizer.state_dict()
    report = {"rank": rank, "optim_keys": sorted(osd), "optim_globals": weights_only_globals(osd)}
    if a.stage == 3:
        msd = engine._zero3_consolidated_16bit_state_dict()  # collective; full on rank 0 ({} elsewhere)
    else:
        msd = engine.module.state_dict()
    report["model_globals"] = weights_only_globals(msd)
    report["module_sd_stage3_raw"] = {k: list(v.shape) for k, v in engine.module.state_dict().items()} if a.stage == 3 else None
    engine_state = {"global_steps": engine.global_steps, "global_samples": engine.global_samples,
                    "skipped_steps": engine.skipped_steps, "micro_steps": engine.micro_steps,
                    "lr_scheduler": sched.state_dict() if sched is not None else None}
    report["engine_state"] = engine_state
    os.makedirs(own, exist_ok=True)
    torch.save({"optim": osd, "model": msd, "engine": engine_state}, f"{own}/rank{rank}.pt")
    print("REPORT", json.dumps(report, default=str), flush=True)
    train(SAVE_AT, STEPS)
    snap = snapshot()
    if rank == 0:
        torch.save(snap, f"/tmp/ds_probe/out/{name}_save.pt")
elif a.phase == "resume_ds":
    path, client = engine.load_checkpoint(ck, tag="t6")
    print("LOADED", rank, path, sorted(client), engine.global_steps, engine.micro_steps, flush=True)
    train(SAVE_AT, STEPS)
    snap = snapshot()
    if rank == 0:
        torch.save(snap, f"/tmp/ds_probe/out/{name}_resume_ds.pt")
elif a.phase == "resume_own":
    from deepspeed.runtime.fp16.loss_scaler import LossScaler, DynamicLossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address
    allowed = [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]
    with torch.serialization.safe_globals(allowed):
        st = torch.load(f"{own}/rank{rank}.pt", weights_only=True)
    if a.stage == 3:
        # the model weights come from the fp32 partitions inside the optimizer state
        pass
    else:
        engine.module.load_state_dict(st["model"])
    sd_list = [None] * torch.distributed.get_world_size()
    sd_list[rank] = st["optim"]
    engine.optimizer.load_state_dict(state_dict_list=sd_list, load_optimizer_states=True,
                                     load_from_fp32_weights=True, param_shapes=engine._get_zero_param_shapes())
    if a.stage == 3:
        engine.optimizer.checkpoint_event_epilogue() if hasattr(engine.optimizer, "checkpoint_event_epilogue") else None
    e = st["engine"]
    engine.global_steps, engine.global_samples, engine.skipped_steps = e["global_steps"], e["global_samples"], e["skipped_steps"]
    engine.micro_steps = e["micro_steps"]
    if sched is not None:
        sched.load_state_dict(e["lr_scheduler"])
    train(SAVE_AT, STEPS)
    snap = snapshot()
    if rank == 0:
        torch.save(snap, f"/tmp/ds_probe/out/{name}_resume_own.pt")
torch.distributed.barrier()
torch.distributed.destroy_process_group()
