"""import warntrace: every warning printed once per (category, message) with the innermost deepspeed/user frame."""
import sys, traceback, warnings
warnings.simplefilter("always")
_seen = set()
def _show(message, category, filename, lineno, file=None, line=None):
    key = (category.__name__, str(message)[:120])
    if key in _seen:
        return
    _seen.add(key)
    stack = [f for f in traceback.extract_stack()[:-1] if "/warnings.py" not in f.filename and "<frozen" not in f.filename]
    ds = [f for f in stack if "/deepspeed/" in f.filename]
    where = f"{ds[-1].filename.split('site-packages/')[-1]}:{ds[-1].lineno} ({ds[-1].name})" if ds else "no deepspeed frame"
    top = [f for f in stack if "ds_probe" in f.filename]
    print(f"WARN {category.__name__} @ {filename.split('site-packages/')[-1]}:{lineno} via {where} from {top[-1].lineno if top else '?'}: {str(message)[:200]}", file=sys.stderr)
warnings.showwarning = _show
