"""Safe mode: configs from less trusted places run no code they name; trusted configs are code.

Each attack writes a marker file if anything it names runs (``os.system``, a ``.py``
base, a module imported for a ``collate_fn`` or an optimizer); in safe mode it is
refused with one line and the marker never appears.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import support
import treadle
from treadle.config import ConfigError, build_trainer, load_config, resolve_type, trainer_kwargs
from treadle.components import build as build_module
from treadle.components.build import build_component, build_dataloader, check_safe, named_types
from treadle.components.safe import RULE, torch_class

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ["examples/digits/digits.yaml", "examples/digits/digits_iter.yaml",
            "examples/mmengine_style/digits_mmengine.yaml"]

# A config whose model is `os.system("touch MARKER")`; the rest as a normal run.
OS_SYSTEM = """\
model: {{type: os.system, command: "touch {marker}"}}
train_dataloader: {{dataset: {{type: digits, split: train}}, batch_size: 32}}
optimizer: {{type: AdamW, lr: 1e-3}}
max_epochs: 1
"""


def one_line(err: ConfigError) -> str:
    text = str(err)
    assert "\n" not in text
    return text


@pytest.fixture
def marker(tmp_path):
    return tmp_path / "MARKER"


@pytest.fixture
def marker_module(tmp_path, monkeypatch, marker):
    """``make(body)``: a module on sys.path that writes the marker when imported; its name."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def make(body: str = "") -> str:
        name = f"marker_{uuid.uuid4().hex[:8]}"
        (tmp_path / f"{name}.py").write_text(f"open({str(marker)!r}, 'w').close()\n{body}")
        monkeypatch.delitem(sys.modules, name, raising=False)  # removed again after the test
        return name
    return make


# -- what safe mode allows -----------------------------------------------------------
@pytest.mark.parametrize("dotted, cls", [
    ("torch.nn.CrossEntropyLoss", nn.CrossEntropyLoss),
    ("torch.nn.modules.loss.CrossEntropyLoss", nn.CrossEntropyLoss),
    ("torch.nn.Linear", nn.Linear),
    ("torch.optim.AdamW", torch.optim.AdamW),
    ("torch.optim.lr_scheduler.StepLR", torch.optim.lr_scheduler.StepLR),
    ("torch.optim.swa_utils.AveragedModel", torch.optim.swa_utils.AveragedModel),
])
def test_torch_nn_and_optim_classes_are_allowed(dotted, cls):
    assert torch_class(dotted) is cls


@pytest.mark.parametrize("dotted", [
    "torch.load", "torch.hub.load", "torch.jit.load", "torch.utils.cpp_extension.load",  # functions outside nn/optim
    "torch.nn.functional.relu", "torch.nn.Module.load_state_dict",  # functions inside
    "torch.nn.functional.importlib.import_module",  # a module imported under another name
    "torch.nn.modules.module.OrderedDict",  # a class defined elsewhere (collections)
    "torch.nn.Module.__class__", "torch.nn._reduction.get_enum",  # private steps
    "torch.utils.data.DataLoader", "torch.Tensor",  # torch classes outside nn/optim
    "torch.nn", "torch.nn.NoSuchClass", "os.system", "subprocess.Popen", "torch..nn.Linear",
])
def test_everything_else_is_not(dotted):
    assert torch_class(dotted) is None


def test_resolve_type_in_safe_mode():
    assert resolve_type("loss", "torch.nn.CrossEntropyLoss", "loss_fn.type", safe=True) is nn.CrossEntropyLoss
    assert resolve_type("optimizer", "AdamW", "optimizer.type", safe=True) is torch.optim.AdamW  # registered
    assert resolve_type("model", support.TinyNet, "model.type", safe=True) is support.TinyNet  # an object: code
    with pytest.raises(ConfigError) as e:
        resolve_type("model", "support.TinyNet", "model.type", safe=True)
    assert one_line(e.value).startswith(f"model.type: {RULE}, not this dotted import path (got 'support.TinyNet'); "
                                        "expected a registered model name (DigitsCNN, RingGAN).")
    with pytest.raises(ConfigError, match=r"loss_fn: safe mode allows only .* \(got 'torch.nn.functional.cross_en"):
        build_component("torch.nn.functional.cross_entropy", "loss", "loss_fn", safe=True)


def test_a_dotted_torch_loss_builds_in_safe_mode():
    loss = build_component({"type": "torch.nn.CrossEntropyLoss", "label_smoothing": 0.1}, "loss", "loss_fn", safe=True)
    assert isinstance(loss, nn.CrossEntropyLoss) and loss.label_smoothing == 0.1


# -- code named by a config: refused in safe mode, run when trusted -------------------
def test_os_system_runs_in_a_trusted_config(tmp_path, marker):
    """The documented behaviour (docs/config.md, "Configs are code"): a dotted type is called."""
    path = tmp_path / "evil.yaml"
    path.write_text(OS_SYSTEM.format(marker=marker))
    cfg = load_config(path, mode="train")
    with pytest.raises(ConfigError, match="built a int, not a torch.nn.Module"):
        build_trainer(cfg)
    assert marker.exists()


def test_os_system_is_refused_in_safe_mode(tmp_path, marker):
    path = tmp_path / "evil.yaml"
    path.write_text(OS_SYSTEM.format(marker=marker))
    with pytest.raises(ConfigError) as e:
        load_config(path, mode="train", safe=True)
    assert one_line(e.value).startswith(f"model.type: {RULE}, not this dotted import path (got 'os.system')")
    assert e.value.source == str(path)
    cfg = load_config(path, mode="train")  # loaded as trusted, then built in safe mode: refused the same way
    with pytest.raises(ConfigError, match=r"^model.type: safe mode allows only"):
        build_trainer(cfg, safe=True)
    with pytest.raises(ConfigError, match=r"^model.type: safe mode allows only"):
        trainer_kwargs(cfg, safe=True)
    assert not marker.exists()


def test_a_set_override_is_checked_too(tmp_path, marker):
    path = tmp_path / "ok.yaml"
    path.write_text(OS_SYSTEM.format(marker=marker).replace("os.system", "DigitsCNN").replace(
        f'command: "touch {marker}"', "num_classes: 10"))
    overrides = ["model.type=subprocess.Popen", f"model.args=[touch, {marker}]"]
    with pytest.raises(ConfigError) as e:
        load_config(path, overrides, mode="train", safe=True)
    assert one_line(e.value).startswith(f"model.type: {RULE}, not this dotted import path (got 'subprocess.Popen')")
    assert not marker.exists()


def test_python_bases_are_refused_before_they_run(tmp_path, marker):
    (tmp_path / "base.yaml").write_text("max_epochs: 1\n")
    (tmp_path / "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\nseed = 1\n")
    top = tmp_path / "top.yaml"
    top.write_text("_base_: [base.yaml, evil.py]\nmodel: {type: DigitsCNN}\n")
    with pytest.raises(ConfigError) as e:
        load_config(top, safe=True)
    assert one_line(e.value) == ("_base_: safe mode refuses the Python base 'evil.py': loading it would run its code; "
                                 "expected YAML bases (.yaml, .yml)")
    assert e.value.source == str(top)  # the file that lists it
    assert not marker.exists()
    # A YAML base that lists the .py one: named as the file that lists it.
    (tmp_path / "middle.yaml").write_text("_base_: evil.py\n")
    top.write_text("_base_: middle.yaml\nmodel: {type: DigitsCNN}\n")
    with pytest.raises(ConfigError) as e:
        load_config(top, safe=True)
    assert "'evil.py'" in str(e.value) and Path(e.value.source).name == "middle.yaml"
    assert not marker.exists()
    assert load_config(top)["seed"] == 1 and marker.exists()  # trusted: the base is code and runs


def test_python_configs_are_refused_before_they_run(tmp_path, marker):
    path = tmp_path / "evil.py"
    path.write_text(f"open({str(marker)!r}, 'w').close()\nmodel = dict(type='DigitsCNN')\n")
    with pytest.raises(ConfigError) as e:
        load_config(path, safe=True)
    assert one_line(e.value) == ("safe mode refuses Python config files: loading one runs its code; "
                                 "expected a YAML config (.yaml, .yml)")
    assert e.value.source == str(path)
    assert not marker.exists()


@pytest.mark.parametrize("safe", [True, False])
def test_collate_fn_paths(marker_module, marker, safe):
    name = marker_module("def collate(batch):\n    return batch\n")
    spec = {"dataset": {"type": "digits", "split": "val"}, "batch_size": 4, "collate_fn": f"{name}.collate"}
    if not safe:  # trusted: the module is imported (and runs)
        assert build_dataloader(spec, "val_dataloader").collate_fn.__module__ == name
        assert marker.exists()
        return
    with pytest.raises(ConfigError) as e:
        build_dataloader(spec, "val_dataloader", safe=True)
    assert one_line(e.value).startswith(f"val_dataloader.collate_fn: {RULE}, not this dotted import path "
                                        f"(got '{name}.collate'); expected no collate_fn (torch's default collate) or one of "
                                        "default_collate, pseudo_collate.")
    with pytest.raises(ConfigError, match=r"^val_dataloader.collate_fn: safe mode allows only"):
        check_safe({"val_dataloader": spec})
    assert not marker.exists()


@pytest.mark.parametrize("where", ["single", "by_name"])
def test_optimizer_types_are_checked_before_the_builder_imports(marker_module, marker, where):
    name = marker_module("import torch\nclass Opt(torch.optim.SGD):\n    pass\n")
    spec = {"type": f"{name}.Opt", "lr": 0.1}
    cfg = {"model": {"type": "DigitsCNN"}, "optimizer": spec if where == "single" else {"gen": spec}}
    key = "optimizer.type" if where == "single" else "optimizer.gen.type"
    with pytest.raises(ConfigError, match=rf"^{key}: safe mode allows only"):
        build_module.check_optimizer(cfg["optimizer"], safe=True)
    with pytest.raises(ConfigError, match=rf"^{key}: safe mode allows only"):
        check_safe(cfg)
    assert not marker.exists()
    assert build_module.check_optimizer({"type": "torch.optim.SGD", "lr": 0.1}, safe=True) is None


def test_scheduler_types(marker_module, marker):
    name = marker_module("class Sched:\n    pass\n")
    with pytest.raises(ConfigError, match=r"^schedulers\[0\].type: safe mode allows only"):
        build_module.check_schedulers([{"type": f"{name}.Sched"}], None, safe=True)
    assert not marker.exists()
    # treadle's names, with an MMEngine scope prefix (dropped, never imported), are fine
    check_safe({"schedulers": [{"type": "mmengine.LinearLR", "end": 2}, {"type": "CosineAnnealingLR"}]})
    build_module.check_schedulers({"type": "mmengine.LinearLR", "end": 2}, None, safe=True)


def test_custom_imports_are_refused_by_safe_mode_and_imported_otherwise(tmp_path, marker_module, marker):
    name = marker_module()
    path = tmp_path / "mm.yaml"
    path.write_text(f"_base_: {ROOT / EXAMPLES[0]}\ncustom_imports: {{imports: [{name}], allow_failed_imports: false}}\n")
    with pytest.raises(ConfigError) as e:
        load_config(path, mode="train", safe=True)
    assert one_line(e.value).startswith("custom_imports: safe mode imports no module a config names")
    assert not marker.exists()
    cfg = load_config(path, mode="train", work_dir=str(tmp_path / "run"))
    assert not marker.exists()  # reading the config imports nothing; building it does, first
    build_trainer(cfg)
    assert marker.exists()


def test_safe_is_not_a_config_key(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: {type: DigitsCNN}\nsafe: false\n")
    with pytest.raises(ConfigError, match=r"^safe: unknown key"):
        load_config(path, safe=True)
    assert "safe" not in load_config(ROOT / EXAMPLES[0], mode="train")


# -- what still works in safe mode -------------------------------------------------------
@pytest.mark.parametrize("example", EXAMPLES)
def test_shipped_examples_build_in_safe_mode(example):
    cfg = load_config(ROOT / example, mode="train", safe=True)
    kw = trainer_kwargs(cfg, safe=True)
    assert kw["model"] == cfg["model"] and isinstance(kw["train_dataloader"], DataLoader)  # the Trainer builds it
    trainer = build_trainer(cfg, safe=True, progress=False)  # the model, the optimizer and schedulers too
    assert isinstance(trainer.module, nn.Module) and trainer.optimizer is not None


def test_named_types_covers_every_name_the_build_resolves(monkeypatch):
    """named_types (safe mode's up-front check) follows trainer_kwargs: whatever the
    build resolves or imports, the check has seen first."""
    seen: list[str] = []
    real_resolve, real_import = build_module.resolve_type, build_module.import_object

    def resolve(kind, type_, path, **kw):
        seen.append(path)
        return real_resolve(kind, type_, path, **kw)

    def import_object(dotted):
        seen.append("collate_fn")
        return real_import(dotted)
    monkeypatch.setattr(build_module, "resolve_type", resolve)
    monkeypatch.setattr(build_module, "import_object", import_object)
    loader = {"dataset": {"type": "support.make_data", "n": 8}, "batch_size": 4,
              "collate_fn": "torch.utils.data.default_collate"}
    cfg = {"model": {"type": "support.TinyNet"}, "train_dataloader": loader, "val_dataloader": dict(loader),
           "test_dataloader": {"dataset": "support.make_data"}, "loss_fn": "torch.nn.CrossEntropyLoss",
           "metrics": {"a": {"type": "Accuracy"}, "b": "Accuracy"},
           "hooks": [{"type": "EarlyStoppingHook", "monitor": "val/acc", "rule": "greater"}, "NaNGuardHook"],
           "optimizer": {"gen": {"type": "torch.optim.SGD", "lr": 0.1}, "disc": {"type": "Adam", "lr": 0.1}},
           "schedulers": {"gen": [{"type": "torch.optim.lr_scheduler.NoSuchLR"}], "disc": {"type": "LinearLR"}}}
    with pytest.raises(ConfigError, match="cannot import"):  # the scheduler path is resolved, then fails
        trainer_kwargs(cfg)
    cfg["schedulers"]["gen"] = [{"type": "StepLR", "step_size": 1}]
    trainer_kwargs(cfg)
    named = {path for _, _, path in named_types(cfg)}
    resolved = {p for p in seen if p != "collate_fn"}
    assert resolved and resolved <= named, resolved - named
    assert seen.count("collate_fn") == 2 and sum(kind == "collate_fn" for kind, _, _ in named_types(cfg)) == 2


# -- the Trainer's config dicts ----------------------------------------------------------
def test_trainer_config_dicts_in_safe_mode(marker_module, marker, tmp_path):
    name = marker_module("import torch\nclass Opt(torch.optim.SGD):\n    pass\ndef collate(b):\n    return b\n")
    common = dict(max_epochs=1, progress=False, log_writers=[], preemption=False)
    data = DataLoader(support.make_data(8), batch_size=4)
    cases = {
        "model.type": dict(model={"type": "os.system", "command": f"touch {marker}"}, train_dataloader=data,
                           optimizer={"type": "SGD", "lr": 0.1}),
        "optimizer.type": dict(model=support.TinyNet(), train_dataloader=data,
                               optimizer={"type": f"{name}.Opt", "lr": 0.1}),
        "optimizer.gen.type": dict(model=support.TinyNet(), train_dataloader=data,
                                   optimizer={"gen": {"type": f"{name}.Opt", "lr": 0.1}}),
        "train_dataloader.collate_fn": dict(model=support.TinyNet(), optimizer={"type": "SGD", "lr": 0.1},
                                            train_dataloader={"dataset": {"type": "digits"},
                                                              "collate_fn": f"{name}.collate"}),
        "hooks[0].type": dict(model=support.TinyNet(), train_dataloader=data, optimizer={"type": "SGD", "lr": 0.1},
                              hooks=[{"type": f"{name}.Opt"}]),
        "loss_fn.type": dict(model=support.TinyNet(), train_dataloader=data, optimizer={"type": "SGD", "lr": 0.1},
                             loss_fn={"type": "torch.nn.functional.cross_entropy"}),
    }
    for key, kwargs in cases.items():
        with pytest.raises(ConfigError) as e:
            treadle.Trainer(**kwargs, **common, safe=True)
        assert one_line(e.value).startswith(f"{key}: {RULE}"), str(e.value)
    assert not marker.exists()
    # Objects from Python are code, hence trusted; torch classes by name are fine.
    trainer = treadle.Trainer(model=support.TinyNet(), train_dataloader=data, safe=True, **common,
                              loss_fn={"type": "torch.nn.CrossEntropyLoss"}, hooks=[{"type": "NaNGuardHook"}],
                              optimizer={"type": "torch.optim.SGD", "lr": 0.1}, metrics={"acc": {"type": "Accuracy"}})
    assert isinstance(trainer.loss_fn, nn.CrossEntropyLoss) and isinstance(trainer.optimizer, torch.optim.SGD)
    with pytest.raises(TypeError, match="safe must be True or False"):
        treadle.Trainer(model=support.TinyNet(), safe="yes")
