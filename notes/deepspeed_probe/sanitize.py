"""A ZeRO optimizer state_dict as plain containers (weights_only-safe without any allowlist), and back."""
import io, sys, torch, warnings
warnings.simplefilter("ignore")
from deepspeed.runtime.fp16.loss_scaler import LossScaler, DynamicLossScaler
from deepspeed.runtime.zero.config import ZeroStageEnum
from deepspeed.utils.tensor_fragment import fragment_address
SCALERS = {"LossScaler": LossScaler, "DynamicLossScaler": DynamicLossScaler}

def to_plain(sd):
    out = dict(sd)
    ls = sd["loss_scaler"]
    out["loss_scaler"] = {"__class__": type(ls).__name__, **vars(ls)}
    out["zero_stage"] = int(sd["zero_stage"])
    if "param_slice_mappings" in sd:
        out["param_slice_mappings"] = [{k: (v.numel, v.start) for k, v in m.items()} for m in sd["param_slice_mappings"]]
    return out

def from_plain(sd):
    out = dict(sd)
    d = dict(sd["loss_scaler"]); cls = SCALERS[d.pop("__class__")]
    ls = cls.__new__(cls); ls.__dict__.update(d); out["loss_scaler"] = ls
    out["zero_stage"] = ZeroStageEnum(sd["zero_stage"])
    if "param_slice_mappings" in sd:
        from collections import OrderedDict
        out["param_slice_mappings"] = [OrderedDict((k, fragment_address(numel=n, start=s)) for k, (n, s) in m.items())
                                       for m in sd["param_slice_mappings"]]
    return out

def same(a, b):
    if isinstance(a, torch.Tensor): return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict): return type(a) == type(b) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)): return type(a) == type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, (LossScaler, DynamicLossScaler)): return type(a) == type(b) and same(vars(a), vars(b))
    return type(a) == type(b) and a == b

for f in sys.argv[1:]:
    osd = torch.load(f, weights_only=False)["optim"]
    buf = io.BytesIO(); torch.save(to_plain(osd), buf); buf.seek(0)
    back = from_plain(torch.load(buf, weights_only=True))  # no allowlist
    print(f, "plain round trip weights_only=True, identical:", same(osd, back))
