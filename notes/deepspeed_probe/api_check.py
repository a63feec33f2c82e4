import os, sys, warnings
warnings.simplefilter("ignore")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch, deepspeed, deepspeed.ops
from common import make_model
deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
torch.distributed.init_process_group("gloo")  # as treadle does, before DeepSpeed
for stage in (1, 2, 3):
    model = make_model(); opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config={
        "train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True, "gradient_clipping": 0.0})
    try:
        torch.optim.lr_scheduler.StepLR(engine.optimizer, 2); sched_ok = True
    except TypeError as e:
        sched_ok = f"TypeError: {e}"
    if torch.distributed.get_rank() == 0:
        print(f"stage {stage}: engine.module is model: {engine.module is model}; basic_optimizer is opt: {engine.basic_optimizer is opt}; "
              f"engine.optimizer.param_groups is opt.param_groups: {engine.optimizer.param_groups is opt.param_groups}; "
              f"engine.optimizer isinstance torch Optimizer: {isinstance(engine.optimizer, torch.optim.Optimizer)}; "
              f"StepLR(engine.optimizer): {sched_ok}; params in opt group: {[tuple(p.shape) for p in opt.param_groups[0]['params']]}", flush=True)
    engine.destroy() if hasattr(engine, "destroy") else None
torch.distributed.barrier(); torch.distributed.destroy_process_group()
