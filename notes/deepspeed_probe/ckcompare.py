import sys, glob, torch
for full in sorted(glob.glob("/tmp/ds_probe/out/*_full.pt")):
    base = full[:-8]
    ref = torch.load(full, weights_only=True)
    for kind in ("save", "resume_ds", "resume_own"):
        try:
            o = torch.load(f"{base}_{kind}.pt", weights_only=True)
        except FileNotFoundError:
            print(base.split('/')[-1], kind, "MISSING"); continue
        bad = [k for k in ref if not torch.equal(ref[k], o[k])]
        print(f"{base.split('/')[-1]:22s} {kind:10s} torch.equal on all {len(ref)} entries: {not bad}" + (f"  differ: {bad[:6]}" if bad else ""))
