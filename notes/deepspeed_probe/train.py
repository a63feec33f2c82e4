"""torchrun --nproc-per-node 2 train.py --stage 1 [--bf16] [--gas 2] [--clip 1.0] [--noshm] [--out f.pt]"""
import argparse
import json
import os
import sys
import time
import warnings

t_start = time.perf_counter()
warnings.simplefilter("default")  # show DeprecationWarnings etc. once per location
if os.environ.get("TRACEWARN"):
    import traceback
    _orig = warnings.showwarning

    def _show(message, category, filename, lineno, file=None, line=None):
        stack = [f for f in traceback.extract_stack()[:-1] if "/warnings.py" not in f.filename and "<frozen" not in f.filename]
        print(f"WARN {category.__name__}: {message}\n" + "".join(traceback.format_list(stack[-14:])), file=sys.stderr)
    warnings.showwarning = _show
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
from torch import nn  # noqa: E402

from common import make_data, make_model, micro  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--stage", type=int, default=1)
p.add_argument("--persist0", action="store_true", help="stage3_param_persistence_threshold=0: really partition tiny params")
p.add_argument("--bf16", action="store_true")
p.add_argument("--gas", type=int, default=1)
p.add_argument("--clip", type=float, default=None, help="None: leave DeepSpeed's default")
p.add_argument("--steps", type=int, default=10)
p.add_argument("--noshm", action="store_true", help="mark deepspeed_shm_comm incompatible before init")
p.add_argument("--torch_pg", action="store_true", help="torch.distributed.init_process_group(gloo) first")
p.add_argument("--ds_init", action="store_true", help="deepspeed.init_distributed(dist_backend='gloo') first")
p.add_argument("--ds_optimizer", default=None, help="use DeepSpeed's optimizer section, e.g. AdamW")
p.add_argument("--torch_adam", action="store_true")
p.add_argument("--out", default=None)
p.add_argument("--offload", default=None, help="offload_optimizer to cpu; value: force key (default|false)")
p.add_argument("--torch_sched", action="store_true", help="a torch StepLR on the user AdamW, stepped by the loop")
p.add_argument("--unmanaged", action="store_true", help="managed_gradient_accumulation=false: the loop owns the window")
a = p.parse_args()

t0 = time.perf_counter()
import deepspeed  # noqa: E402
t_import = time.perf_counter() - t0

if a.noshm:
    import deepspeed.ops
    t0 = time.perf_counter()
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    t_probe = time.perf_counter() - t0
else:
    t_probe = 0.0

if a.torch_pg:
    torch.distributed.init_process_group("gloo")
if a.ds_init:
    deepspeed.init_distributed(dist_backend="gloo")

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
model = make_model()
cfg = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": a.gas,
    "zero_optimization": {"stage": a.stage},
    "zero_allow_untested_optimizer": True,
    "steps_per_print": 10**9,
    "wall_clock_breakdown": False,
}
if a.clip is not None:
    cfg["gradient_clipping"] = a.clip
if a.persist0:
    cfg["zero_optimization"]["stage3_param_persistence_threshold"] = 0
if a.unmanaged:
    cfg["managed_gradient_accumulation"] = False
if a.offload:
    cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    if a.offload == "false":
        cfg["zero_force_ds_cpu_optimizer"] = False
if a.bf16:
    cfg["bf16"] = {"enabled": True}
kwargs = {}
if a.ds_optimizer:
    cfg["optimizer"] = {"type": a.ds_optimizer, "params": {"lr": 1e-2, "weight_decay": 0.01}}
    if a.torch_adam:
        cfg["optimizer"]["params"]["torch_adam"] = True
else:
    kwargs["optimizer"] = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)

user_sched = None
if a.torch_sched:
    user_sched = torch.optim.lr_scheduler.StepLR(kwargs["optimizer"], step_size=2, gamma=0.5)
rng_before = torch.random.get_rng_state().clone()
t0 = time.perf_counter()
engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg, **kwargs)
t_init = time.perf_counter() - t0
rng_consumed = not torch.equal(rng_before, torch.random.get_rng_state())

X, Y = make_data(a.steps, a.gas)
dtype = torch.bfloat16 if a.bf16 else torch.float32
t0 = time.perf_counter()
for s in range(a.steps):
    for m in range(a.gas):
        x, y = micro(X, Y, s, m, a.gas, rank)
        out = engine(x.to(dtype))
        loss = nn.functional.mse_loss(out.float(), y)
        if a.unmanaged:
            engine.backward(loss / a.gas, scale_wrt_gas=False)
        else:
            engine.backward(loss)
            engine.step()
    if a.unmanaged:
        engine.step()
    if user_sched is not None:
        user_sched.step()
t_train = time.perf_counter() - t0


def full_weights(engine):
    if a.stage == 3:
        params = list(engine.module.parameters())
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            return {k: v.detach().clone().float() for k, v in engine.module.state_dict().items()}
    return {k: v.detach().clone().float() for k, v in engine.module.state_dict().items()}


w = full_weights(engine)
info = dict(rank=rank, stage=a.stage, bf16=a.bf16, gas=a.gas, clip=engine.gradient_clipping(),
            optimizer=type(engine.optimizer).__name__, basic=type(engine.basic_optimizer).__name__,
            global_steps=engine.global_steps, micro_steps=engine.micro_steps,
            t_import=round(t_import, 2), t_probe=round(t_probe, 2), t_init=round(t_init, 2),
            t_train=round(t_train, 2), t_total=round(time.perf_counter() - t_start, 2),
            backend=torch.distributed.get_backend(), rng_consumed_by_initialize=rng_consumed,
            lr=[g['lr'] for g in engine.optimizer.param_groups])
print("INFO", json.dumps(info), flush=True)
if rank == 0 and a.out:
    torch.save(w, a.out)
if os.environ.get("NO_DESTROY") != "1":
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
