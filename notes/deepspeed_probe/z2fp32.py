import sys, warnings, torch
warnings.simplefilter("ignore")
from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
for name in sys.argv[1:]:
    sd = get_fp32_state_dict_from_zero_checkpoint(f"/tmp/ds_probe/ck/{name}", tag="t6")
    own0 = torch.load(f"/tmp/ds_probe/own/{name}/rank0.pt", weights_only=False)["model"]
    print(name, {k: (tuple(v.shape), v.dtype) for k, v in sd.items()})
    print("  zero_to_fp32 vs own consolidated model (rank0):", {k: (own0[k].dtype, (sd[k] - own0[k].float()).abs().max().item()) for k in sd})
