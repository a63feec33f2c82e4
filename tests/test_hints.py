"""Errors from the user's model, loss and metrics carry one line of context (treadle/hints.py),
torch's loss-broadcasting warning is an error during a run, metrics' update signatures are
checked at construction, and the command line prints the short form (issue 20)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import treadle
from treadle.hints import hint_of

from cli_support import run
from support import DEVICE, TinyNet, make_data

# A hint names a tensor's device unless it is the CPU ("Tensor (8, 6) float32 on cuda:0"): the
# batches of these runs are on DEVICE.
ON = "" if DEVICE.type == "cpu" else f" on {DEVICE}"


def regression_data(n=16):
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 6, generator=g), torch.randn(n, generator=g))


class TupleNet(TinyNet):
    def forward(self, x):
        return super().forward(x), x


def trainer(model=None, loss_fn=None, data=None, **kw):
    kw.setdefault("max_epochs", 1)
    return treadle.Trainer(model or TinyNet(), train_dataloader=DataLoader(data or make_data(16), batch_size=8),
                           loss_fn=loss_fn or nn.CrossEntropyLoss(), optimizer=dict(type="SGD", lr=0.1),
                           progress=False, **kw)


def notes(error):
    return [n for n in getattr(error, "__notes__", []) if n.startswith("treadle: ")]


@pytest.mark.parametrize("timed", [False, True])
def test_a_loss_with_reduction_none_says_it_must_be_a_scalar(timed):
    with pytest.raises(RuntimeError, match="grad can be implicitly created only for scalar outputs") as info:
        trainer(loss_fn=nn.CrossEntropyLoss(reduction="none"), timer_breakdown=timed).fit()
    assert notes(info.value) == [f"treadle: {hint_of(info.value)}"]  # one line, added once
    assert "the loss has shape (8,), it must be a scalar" in hint_of(info.value)
    assert "reduction='mean'" in hint_of(info.value)


def test_a_model_returning_a_tuple_names_what_the_loss_got():
    with pytest.raises(TypeError, match="must be Tensor, not tuple") as info:
        trainer(model=TupleNet()).fit()
    hint = hint_of(info.value)
    assert "in loss_fn(outputs, targets) of the training step" in hint
    assert (f"outputs: tuple of 2 [Tensor (8, 3) float32{ON}, Tensor (8, 6) float32{ON}], "
            f"targets: Tensor (8,) int64{ON}") in hint
    assert "the model returned a tuple" in hint and "outputs[0]" in hint


@pytest.mark.parametrize("loss", [nn.MSELoss(), nn.L1Loss(), nn.SmoothL1Loss(), nn.HuberLoss()])
def test_a_broadcasting_loss_is_an_error_not_a_warning(loss):
    model = nn.Linear(6, 1)  # (N, 1) outputs against (N,) targets: torch only warns and broadcasts to (N, N)
    with pytest.raises(ValueError, match="different to the input size") as info:
        trainer(model=model, loss_fn=loss, data=regression_data()).fit()
    assert isinstance(info.value.__cause__, UserWarning)
    assert "outputs (8, 1) and targets (8,) would be broadcast" in hint_of(info.value)
    # Outside a run the warning is torch's own again: the filter was only for the run.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss(torch.zeros(4, 1), torch.zeros(4))
    assert any("different to the input size" in str(w.message) for w in caught)


def test_the_same_in_validation():  # and without loss_fn: the model is given the whole batch
    t = treadle.Trainer(nn.Linear(6, 1), val_dataloader=DataLoader(regression_data(), batch_size=8),
                        loss_fn=nn.MSELoss(), progress=False)
    with pytest.raises(ValueError) as info:
        t.validate()
    assert "in loss_fn(outputs, targets) of evaluation" in hint_of(info.value)
    t = treadle.Trainer(TinyNet(), val_dataloader=DataLoader(make_data(8), batch_size=8), progress=False)
    with pytest.raises(TypeError) as info:
        t.validate()
    assert hint_of(info.value).startswith(f"in model(batch) of evaluation, batch: list of 2 [Tensor (8, 6) float32{ON}, "
                                          f"Tensor (8,) int64{ON}]; without loss_fn the model is given the whole batch")


def test_an_error_in_the_model_names_the_inputs():
    with pytest.raises(RuntimeError, match="cannot be multiplied") as info:
        trainer(model=TinyNet(dim=7)).fit()
    assert hint_of(info.value).startswith(f"in model(inputs) of the training step, inputs: Tensor (8, 6) float32{ON}; "
                                          "a layer does not fit")


class PredsFirst:
    def __init__(self):
        self.reset()

    def reset(self):
        self.dtypes = []

    def update(self, preds, target):
        self.dtypes.append(preds.dtype)
        if target.dtype != torch.int64:
            raise TypeError("targets must be class indices")

    def compute(self):
        return 0.0


class OneArgument(PredsFirst):
    def update(self, preds):  # forgot the targets
        pass


def test_a_metric_error_names_the_metric_and_the_argument_order():
    data = TensorDataset(torch.randn(16, 6), torch.rand(16))  # float targets: not class indices
    t = treadle.Trainer(TinyNet(), val_dataloader=DataLoader(data, batch_size=8), metrics={"m": PredsFirst()},
                        loss_fn=lambda outputs, targets: outputs.mean(), progress=False)
    with pytest.raises(TypeError, match="targets must be class indices") as info:
        t.validate()
    hint = hint_of(info.value)
    assert hint.startswith(f"in metrics['m'].update(outputs, targets) during validation, outputs: Tensor (8, 3) "
                           f"float32{ON}, targets: Tensor (8,) float32{ON};")
    assert "the model's outputs first" in hint


def test_metric_signatures_are_checked_when_the_trainer_is_built():
    with pytest.raises(TypeError, match=r"metrics\['m'\] \(OneArgument\): update\(preds\) cannot be called as "
                                        r"update\(outputs, targets\)"):
        treadle.Trainer(TinyNet(), metrics={"m": OneArgument()})
    treadle.Trainer(TinyNet(), metrics={"ok": PredsFirst(), "star": type("S", (PredsFirst,), {
        "update": lambda self, *args: None})()})


def test_metrics_get_float32_outputs_under_bf16():
    metric = PredsFirst()
    t = treadle.Trainer(TinyNet(), val_dataloader=DataLoader(make_data(16), batch_size=8),
                        metrics={"m": metric}, precision="bf16", loss_fn=nn.CrossEntropyLoss(), progress=False)
    t.validate()
    assert metric.dtypes == [torch.float32, torch.float32]


def test_the_happy_path_reads_nothing_in_the_step(monkeypatch):
    """The hints live in except clauses: the step (and the metrics' update path) read no
    tensor to the host and sync nothing, in training and validation, with bf16 too."""
    import traceback

    readers = []
    for name in ("item", "tolist", "__bool__", "cpu", "numpy"):
        original = getattr(torch.Tensor, name)

        def spy(self, *a, _orig=original, **k):
            readers.extend((f.filename, f.name) for f in traceback.extract_stack())
            return _orig(self, *a, **k)
        monkeypatch.setattr(torch.Tensor, name, spy)
    metric = PredsFirst()
    for precision in ("32", "bf16"):
        trainer(data=make_data(32), val_dataloader=DataLoader(make_data(16), batch_size=8), metrics={"m": metric},
                precision=precision).fit()
    assert readers  # the spy works (the logger reads at its interval)
    assert not [(f, name) for f, name in readers if f.endswith(("treadle/engine/step.py", "treadle/hints.py"))
                or name in ("update_metrics", "as_float32")]  # (metrics.to_python reads once per pass)


# -- the command line: the short form -------------------------------------------------------
BROKEN = "--set", "loss_fn={type: CrossEntropyLoss, reduction: none}"


@pytest.mark.parametrize("full", [False, True])
def test_the_console_shows_the_short_form_and_log_txt_the_full_traceback(tiny, tmp_path, capsys, monkeypatch, full):
    if full:
        monkeypatch.setenv("TREADLE_FULL_TRACEBACK", "1")
    rc, out, err = run(capsys, "train", tiny, "--work-dir", tmp_path / "w", *BROKEN)
    assert rc == 1
    assert ("Traceback" in err) is full
    short = err[err.index("treadle train: error"):].strip().splitlines()
    assert short[0] == ("treadle train: error in epoch 1, iteration 1: RuntimeError: grad can be implicitly created "
                        "only for scalar outputs")
    assert short[1].startswith("  treadle: in backward of the training step: the loss has shape (8,)")
    assert short[-1].startswith(f"  full traceback: in {tmp_path / 'w' / 'log.txt'}; --debug or "
                                "TREADLE_FULL_TRACEBACK=1")
    assert len(short) <= 4
    log = (tmp_path / "w" / "log.txt").read_text()
    assert "failed in epoch 1, iteration 1: RuntimeError" in log and "Traceback (most recent call last)" in log
    assert "Traceback" not in out


def test_the_short_form_points_at_the_users_line(tmp_path, capsys):
    (tmp_path / "mymodel.py").write_text("import torch\n\n\nclass Net(torch.nn.Module):\n"
                                         "    def __init__(self):\n        super().__init__()\n"
                                         "        self.fc = torch.nn.Linear(7, 3)\n\n"
                                         "    def forward(self, x):\n        return self.fc(x)\n")
    from cli_support import TINY

    cfg = tmp_path / "c.yaml"
    cfg.write_text(TINY.replace("support.TinyNet", "mymodel.Net"))
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        rc, _, err = run(capsys, "train", cfg, "--work-dir", tmp_path / "w")
    finally:
        sys.path.remove(str(tmp_path))
    assert rc == 1
    assert f"  at {tmp_path / 'mymodel.py'}:10 in forward: return self.fc(x)" in err.splitlines()


def test_float_class_targets_and_float64_inputs_get_their_fix():
    # torch's own message differs by device and release (CPU: "expected scalar type Long", CUDA: a
    # NotImplementedError "... not implemented for 'Float'"): the hint is what treadle promises.
    floats = TensorDataset(torch.randn(16, 6), torch.rand(16))
    with pytest.raises(RuntimeError) as info:
        trainer(data=floats).fit()
    hint = hint_of(info.value)
    assert hint.startswith(f"in loss_fn(outputs, targets) of the training step, outputs: Tensor (8, 3) float32{ON}, "
                           f"targets: Tensor (8,) float32{ON}; ")
    assert "this loss takes class indices as int64 targets: convert them with targets.long()" in hint
    doubles = TensorDataset(torch.randn(16, 6, dtype=torch.float64), torch.randint(0, 3, (16,)))
    with pytest.raises(RuntimeError) as info:
        trainer(data=doubles).fit()
    assert f"inputs: Tensor (8, 6) float64{ON}; the inputs are float64 while the model is float32" in \
        hint_of(info.value)


def test_float_class_targets_are_told_whatever_torchs_wording():
    # The hint follows from the tensors: CUDA's kernel error does not say "expected scalar type Long".
    from treadle.hints import loss_error

    error = loss_error(NotImplementedError("\"nll_loss_forward_reduce_cuda_kernel_2d_index\" not implemented for "
                                           "'Float'"), torch.randn(4, 3), torch.rand(4), "train")
    assert hint_of(error).endswith("; this loss takes class indices as int64 targets: convert them with "
                                   "targets.long() (or build the dataset with int64 labels)")
    same_shape = loss_error(RuntimeError("something else"), torch.randn(4, 3), torch.rand(4, 3), "train")
    assert "int64" not in hint_of(same_shape)  # probabilities as targets: not class indices
