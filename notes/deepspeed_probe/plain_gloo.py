import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1000)
for _ in range(50):
    dist.all_reduce(t)
    dist.all_gather_into_tensor(torch.empty(2000), t)
print("ok", dist.get_rank())
