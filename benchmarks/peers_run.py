"""One run of ``benchmarks/peers.py``: one workload trained by one runner in this process.

``peers.py`` starts this script once per run, in a fresh interpreter, and reads the last
line it prints: ``RESULT {json}`` with the seconds of the whole fit, of the steady state
and the loss of the last step (``{"missing": module}`` when the runner's package is not
installed). Every runner gets the same model (built under ``torch.manual_seed(0)``), the same
loader over the same map-style Dataset, AdamW with the same arguments and the same
precision; see peers.py for the settings and what each figure covers.

    python benchmarks/peers_run.py RUNNER WORKLOAD [--device cpu] [--warmup 20] [--steps 100]
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpt2  # the decoder of benchmarks/gpt2.py, reused as it is

# The package each runner needs, imported before the clocks start (None: torch only).
PACKAGES = {"hand": None, "treadle": "treadle", "lightning": "lightning", "accelerate": "accelerate",
            "mmengine": "mmengine", "ignite": "ignite"}

# Sizes by workload and device type: launch-bound on the GPU, and small enough on one CPU thread.
#   mlp: widths, batch;  cnn: base width, image side, batch;  gpt2: Config fields, batch.
SIZES: dict[str, dict[str, dict[str, Any]]] = {
    "mlp": {"cuda": dict(widths=(512, 1024, 1024, 10), batch=512),
            "cpu": dict(widths=(128, 256, 256, 10), batch=64)},
    "cnn": {"cuda": dict(width=64, side=32, batch=256), "cpu": dict(width=8, side=32, batch=16)},
    "gpt2": {"cuda": dict(config=gpt2.Config(), batch=16),
             "cpu": dict(config=gpt2.Config(n_layer=2, n_head=4, n_embd=64, seq=64, vocab=512), batch=4)},
}
N_BATCHES = 16  # distinct batches; a run goes round them in order, in one epoch (no epoch's end is timed)


def describe(name: str, device_type: str) -> str:
    """The workload's model and batch in a few words, for the table."""
    size = SIZES[name][device_type]
    if name == "mlp":
        return f"MLP {'-'.join(map(str, size['widths']))}, batch {size['batch']}"
    if name == "cnn":
        return f"ResNet-18 (width {size['width']}), {size['side']}x{size['side']}, batch {size['batch']}"
    c = size["config"]
    return f"GPT-2 {c.n_layer}x{c.n_embd}, seq {c.seq}, vocab {c.vocab}, batch {size['batch']}"


# -- the models ---------------------------------------------------------------------------
class BasicBlock(nn.Module):
    """ResNet's two 3x3 convolutions with batch norm and an identity (or 1x1) shortcut."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = nn.Identity()
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.short(x))


class ResNet18(nn.Module):
    """ResNet-18 for small images: a 3x3 stem, four stages of two blocks (widths w, 2w, 4w, 8w)."""

    def __init__(self, width: int = 64, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        blocks, cin = [], width
        for i, stride in enumerate((1, 2, 2, 2)):
            cout = width * 2**i
            blocks += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(F.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1), 1))


def mlp(widths: tuple[int, ...]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(widths):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


# -- the workload -------------------------------------------------------------------------
@dataclass
class Workload:
    name: str
    device: torch.device
    model: nn.Module            # built under torch.manual_seed(0): the same weights in every run
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    data: torch.utils.data.Dataset
    batch: int
    per_sample: bool            # items are samples (collated by the loader) rather than whole batches
    optim: dict[str, Any]       # AdamW's arguments
    bf16: bool                  # bf16 autocast (CUDA), else fp32

    def loader(self) -> torch.utils.data.DataLoader:
        """The same loader for every runner: in order (no shuffle), no workers."""
        if self.per_sample:
            return torch.utils.data.DataLoader(self.data, batch_size=self.batch, shuffle=False,
                                               pin_memory=self.device.type == "cuda")
        # One item a batch, taken as it is: a loader with a batch sampler, as MMEngine's loops require.
        return torch.utils.data.DataLoader(self.data, batch_size=1, shuffle=False, collate_fn=only_item)


def only_item(items: list) -> Any:
    """The loader's collate_fn for whole batches: its one item (a batch already)."""
    return items[0]


class Batches(torch.utils.data.Dataset):
    """Map-style, ``length`` items: item i is batch ``i % N_BATCHES``, made ahead (and pinned on
    CUDA), as a prefetching loader would hand it over; what is left to time is the engine's work."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch: int, pin: bool, length: int) -> None:
        self.items = [(x[i:i + batch].clone(), y[i:i + batch].clone()) for i in range(0, len(x), batch)]
        if pin:
            self.items = [(a.pin_memory(), b.pin_memory()) for a, b in self.items]
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.items[i % len(self.items)]


class Samples(torch.utils.data.Dataset):
    """Map-style, ``length`` items: item i is sample ``i % len(x)``; the DataLoader collates them."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, length: int) -> None:
        self.x, self.y, self.length = x, y, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        i %= len(self.x)
        return self.x[i], self.y[i]


def make_workload(name: str, device: torch.device, per_sample: bool, steps: int) -> Workload:
    """The workload, its data one epoch of ``steps`` batches."""
    size = SIZES[name][device.type]
    n = size["batch"] * N_BATCHES
    g = torch.Generator().manual_seed(1)
    torch.manual_seed(0)
    if name == "mlp":
        model, loss_fn = mlp(size["widths"]), F.cross_entropy
        x, y = torch.randn(n, size["widths"][0], generator=g), torch.randint(0, size["widths"][-1], (n,), generator=g)
        optim: dict[str, Any] = dict(lr=1e-3)
    elif name == "cnn":
        model, loss_fn = ResNet18(size["width"]), F.cross_entropy
        x, y = torch.randn(n, 3, size["side"], size["side"], generator=g), torch.randint(0, 10, (n,), generator=g)
        optim = dict(lr=1e-3)
    else:
        c: gpt2.Config = size["config"]
        model, loss_fn = gpt2.GPT(c), gpt2.lm_loss
        tokens = torch.randint(0, c.vocab, (n, c.seq + 1), generator=g)
        x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        optim = dict(lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)
    cuda = device.type == "cuda"
    if cuda:
        optim["fused"] = True  # given to every runner (treadle would pick it on CUDA by itself)
    data = Samples(x, y, steps * size["batch"]) if per_sample else Batches(x, y, size["batch"], cuda, steps)
    return Workload(name, device, model, loss_fn, data, size["batch"], per_sample, optim, bf16=cuda)


# -- the clocks ---------------------------------------------------------------------------
CLOCKS = {"wall": time.perf_counter, "process": time.process_time}


class Marks:
    """Steady state: from the start of step ``warmup`` to the end of the last step, each mark
    read after a device synchronization. Keeps the last step's loss (read at the end).
    ``clock``: wall time, or the CPU time of the whole process (every thread of it)."""

    def __init__(self, device: torch.device, warmup: int, total: int, clock: str = "wall") -> None:
        self.device, self.warmup, self.total, self.clock = device, warmup, total, CLOCKS[clock]
        self.start = self.end = float("nan")
        self.loss: Any = None

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def before(self, i: int) -> None:
        """Called before step ``i`` (0-based)."""
        if i == self.warmup:
            self.sync()
            self.start = self.clock()

    def after(self, i: int, loss: Any) -> None:
        """Called after step ``i`` with its loss (a tensor, left on the device until the end)."""
        if i == self.total - 1:
            self.loss = loss
            self.sync()
            self.end = self.clock()


# -- the runners: each trains w.model for marks.total steps ---------------------------------
def run_hand(w: Workload, marks: Marks, work_dir: str) -> None:
    dev = w.device
    model = w.model.to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), **w.optim)
    for i, (x, y) in enumerate(w.loader()):  # one epoch of marks.total batches
        marks.before(i)
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=w.bf16):
            loss = w.loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        marks.after(i, loss.detach())


def run_treadle(w: Workload, marks: Marks, work_dir: str) -> None:
    import treadle

    class Start(treadle.Hook):
        priority = "HIGHEST"  # before every other hook of the step

        def before_train_iter(self, trainer: Any, batch: Any) -> None:
            marks.before(trainer.state.iter)

    class End(treadle.Hook):
        priority = "LOWEST"  # after every other hook of the step

        def after_train_iter(self, trainer: Any, batch: Any, outputs: Any) -> None:
            marks.after(trainer.state.iter, outputs["loss"])

    trainer = treadle.Trainer(w.model, work_dir=work_dir, train_dataloader=w.loader(), loss_fn=w.loss_fn,
                              optimizer=dict(type="AdamW", **w.optim), max_iters=marks.total,
                              precision="bf16" if w.bf16 else "32", checkpoint=False, progress=False,
                              hooks=[Start(), End()])
    trainer.fit()


def run_lightning(w: Workload, marks: Marks, work_dir: str) -> None:
    import lightning as L

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = w.model

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = w.loss_fn(self.net(x), y)
            self.log("loss", loss)  # what a Lightning user writes; logged every 50 steps by default
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), **w.optim)

    class Mark(L.Callback):
        i = 0

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            marks.before(self.i)

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            marks.after(self.i, outputs["loss"].detach())
            self.i += 1

    trainer = L.Trainer(accelerator=w.device.type, devices=1, precision="bf16-mixed" if w.bf16 else "32-true",
                        max_steps=marks.total, enable_checkpointing=False, enable_progress_bar=False,
                        default_root_dir=work_dir, callbacks=[Mark()])
    trainer.fit(Module(), w.loader())


def run_accelerate(w: Workload, marks: Marks, work_dir: str) -> None:
    from accelerate import Accelerator

    acc = Accelerator(mixed_precision="bf16" if w.bf16 else "no", cpu=w.device.type == "cpu", project_dir=work_dir)
    model = w.model.to(acc.device)
    opt = torch.optim.AdamW(model.parameters(), **w.optim)
    model, opt, loader = acc.prepare(model, opt, w.loader())  # moves batches; autocasts the forward
    model.train()
    for i, (x, y) in enumerate(loader):
        marks.before(i)
        loss = w.loss_fn(model(x), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad(set_to_none=True)
        marks.after(i, loss.detach())
    acc.end_training()


def run_mmengine(w: Workload, marks: Marks, work_dir: str) -> None:
    from mmengine.hooks import Hook
    from mmengine.model import BaseModel
    from mmengine.runner import Runner

    class Model(BaseModel):
        def __init__(self) -> None:
            super().__init__()
            self.net = w.model

        def forward(self, inputs: torch.Tensor, targets: Any = None, mode: str = "tensor") -> Any:
            out = self.net(inputs)
            return {"loss": w.loss_fn(out, targets)} if mode == "loss" else out

    class Start(Hook):
        priority = "HIGHEST"

        def before_train_iter(self, runner: Any, batch_idx: int, data_batch: Any = None) -> None:
            marks.before(runner.iter)

    class End(Hook):
        priority = "LOWEST"

        def after_train_iter(self, runner: Any, batch_idx: int, data_batch: Any = None, outputs: Any = None) -> None:
            marks.after(runner.iter, outputs["loss"].detach())

    optimizer = dict(type="AdamW", **w.optim)
    wrapper = dict(type="AmpOptimWrapper", dtype="bfloat16", optimizer=optimizer) if w.bf16 else \
        dict(type="OptimWrapper", optimizer=optimizer)
    runner = Runner(model=Model(), work_dir=work_dir, train_dataloader=w.loader(), optim_wrapper=wrapper,
                    train_cfg=dict(by_epoch=False, max_iters=marks.total), default_hooks=dict(checkpoint=None),
                    custom_hooks=[Start(), End()], env_cfg=dict(cudnn_benchmark=w.device.type == "cuda"))
    runner.train()


def run_ignite(w: Workload, marks: Marks, work_dir: str) -> None:
    from ignite.engine import Events, create_supervised_trainer

    model = w.model.to(w.device).train()
    opt = torch.optim.AdamW(model.parameters(), **w.optim)
    # Ignite's amp_mode autocasts to float16: bf16 goes through model_fn. Its default
    # output_transform reads the loss with .item() every step, as its users get it.
    trainer = create_supervised_trainer(model, opt, w.loss_fn, device=w.device, non_blocking=True,
                                        model_fn=lambda m, x: _bf16(m, x, w.bf16))
    trainer.add_event_handler(Events.ITERATION_STARTED, lambda e: marks.before(e.state.iteration - 1))
    trainer.add_event_handler(Events.ITERATION_COMPLETED, lambda e: marks.after(e.state.iteration - 1, e.state.output))
    trainer.run(w.loader(), max_epochs=1)


def _bf16(model: nn.Module, x: torch.Tensor, enabled: bool) -> torch.Tensor:
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=enabled):
        return model(x)


RUNNERS: dict[str, Callable[[Workload, Marks, str], None]] = {
    "hand": run_hand, "treadle": run_treadle, "lightning": run_lightning, "accelerate": run_accelerate,
    "mmengine": run_mmengine, "ignite": run_ignite}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runner", choices=tuple(RUNNERS))
    p.add_argument("workload", choices=tuple(SIZES))
    p.add_argument("--device", default="cpu")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--threads", type=int, default=1, help="torch threads on the CPU")
    p.add_argument("--per-sample", action="store_true")
    p.add_argument("--clock", choices=tuple(CLOCKS), default="wall", help="of the steady state")
    args = p.parse_args()

    package, version = PACKAGES[args.runner], torch.__version__
    if package is not None:
        try:
            version = importlib.import_module(package).__version__
        except ImportError:
            print("RESULT " + json.dumps({"missing": package}), flush=True)
            return
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device())
        torch.cuda.set_device(device.index)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
    else:
        torch.set_num_threads(args.threads)
    marks = Marks(device, args.warmup, args.warmup + args.steps, args.clock)
    w = make_workload(args.workload, device, args.per_sample, marks.total)
    with tempfile.TemporaryDirectory(prefix=f"peers-{args.runner}-") as work_dir:
        start = time.perf_counter()
        RUNNERS[args.runner](w, marks, work_dir)
        marks.sync()
        fit_s = time.perf_counter() - start
        fit_end = time.time()  # peers.py takes the time from the process's start to here
    print("RESULT " + json.dumps({
        "version": version, "fit_s": fit_s, "fit_end": fit_end, "steady_s": marks.end - marks.start, "steady_steps": args.steps,
        "loss": float(marks.loss), "threads": torch.get_num_threads(),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}), flush=True)


if __name__ == "__main__":
    main()
