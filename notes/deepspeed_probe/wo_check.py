"""For every file of DeepSpeed checkpoints under ck/: does torch.load(weights_only=True) work, and which globals does it refuse?"""
import glob, importlib, re, sys, torch, warnings
warnings.simplefilter("ignore")
def check(path):
    needed, names = [], []
    while True:
        try:
            with torch.serialization.safe_globals(needed):
                torch.load(path, weights_only=True)
            return names
        except Exception as e:
            m = re.search(r"Unsupported global: GLOBAL ([\w\.]+)", str(e))
            if not m:
                return names + [f"<error: {str(e)[:200]}>"]
            mod, _, attr = m.group(1).rpartition(".")
            needed.append(getattr(importlib.import_module(mod), attr)); names.append(m.group(1))
for d in sorted(glob.glob(sys.argv[1] if len(sys.argv) > 1 else "/tmp/ds_probe/ck/*")):
    for f in sorted(glob.glob(d + "/*/*.pt")):
        g = check(f)
        print(f"{f.replace('/tmp/ds_probe/ck/',''):62s} weights_only ok: {not g}  refused globals: {g}")
