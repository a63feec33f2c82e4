"""python compare.py OUT.pt GAS CLIP -> max abs diff vs the single-process reference (doubled batch)."""
import sys, torch
from common import reference
w = torch.load(sys.argv[1], weights_only=True)
ref = reference(10, int(sys.argv[2]), clip=float(sys.argv[3]), sched=len(sys.argv) > 4 and sys.argv[4] == 'sched')
d = max((w[k] - ref[k]).abs().max().item() for k in ref)
init = __import__("common").make_model().state_dict()
moved = max((ref[k] - init[k]).abs().max().item() for k in ref)
print(f"{sys.argv[1]}: max|ds-ref|={d:.3g} (weights moved by up to {moved:.3g})")
