"""GAN configs: ``optim_wrapper`` with mmagic's ``MultiOptimWrapperConstructor`` becomes
treadle's optimizers by name, one per submodule with its own ``paramwise_cfg``, the
schedulers built for each optimizer as MMEngine's runner builds them.

Checked against the real thing where it is importable: mmagic's constructor (its module
loaded by path, its registry bound to MMEngine's: mmagic's package needs mmcv's compiled
ops) over MMEngine 0.10.7's ``DefaultOptimWrapperConstructor``: the same parameters in
each optimizer with the same options; and MMEngine's Runner training a small GAN with it
ends with the weights treadle's run of the translated config ends with. Skipped when
mmengine or mmagic is absent; the translation itself is checked without them."""

from __future__ import annotations

import importlib.util
import types
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import treadle
from support import ON_CPU, load_module_file
from treadle.components.errors import ConfigError
from treadle.openmmlab.translate import translate


class TinyGAN(nn.Module):
    """A generator with BatchNorm and biases, a discriminator; MMEngine's train_step."""

    def __init__(self) -> None:
        super().__init__()
        self.generator = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 4))
        self.discriminator = nn.Sequential(nn.Linear(4, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1))

    def forward(self, x):
        return self.generator(x)

    def train_step(self, data, optim_wrapper):
        real, noise = data["real"], data["noise"]
        d_opt, g_opt = optim_wrapper["discriminator"], optim_wrapper["generator"]
        with d_opt.optim_context(self.discriminator):
            fake = self.generator(noise).detach()
            loss_d = nn.functional.softplus(self.discriminator(fake)).mean() + \
                nn.functional.softplus(-self.discriminator(real)).mean()
        d_opt.update_params(loss_d)
        with g_opt.optim_context(self.generator):
            loss_g = nn.functional.softplus(-self.discriminator(self.generator(noise))).mean()
        g_opt.update_params(loss_g)
        return {"loss_d": loss_d.detach(), "loss_g": loss_g.detach()}


OPTIM_WRAPPER = dict(
    constructor="MultiOptimWrapperConstructor",
    generator=dict(type="OptimWrapper", optimizer=dict(type="Adam", lr=2e-3, betas=(0.5, 0.999), weight_decay=1e-2),
                   paramwise_cfg=dict(norm_decay_mult=0.0, bias_lr_mult=2.0, custom_keys={"3": dict(lr_mult=0.5)})),
    discriminator=dict(type="OptimWrapper", optimizer=dict(type="SGD", lr=1e-2, momentum=0.9, weight_decay=1e-3),
                       paramwise_cfg=dict(bias_decay_mult=0.0)))
SCHEDULER = dict(type="LinearLR", start_factor=0.5, by_epoch=False, begin=0, end=4)


def test_translation_gives_optimizers_by_name_and_schedulers_for_each():
    out = translate({"optim_wrapper": OPTIM_WRAPPER, "param_scheduler": [SCHEDULER]})
    assert out["optimizer"] == {
        "generator": {"type": "Adam", "lr": 2e-3, "betas": (0.5, 0.999), "weight_decay": 1e-2,
                      "paramwise": OPTIM_WRAPPER["generator"]["paramwise_cfg"]},
        "discriminator": {"type": "SGD", "lr": 1e-2, "momentum": 0.9, "weight_decay": 1e-3,
                          "paramwise": {"bias_decay_mult": 0.0}}}
    assert out["schedulers"] == {"generator": [SCHEDULER], "discriminator": [SCHEDULER]}
    amp = translate({"optim_wrapper": {"constructor": "mmagic.MultiOptimWrapperConstructor",
                                       "g": {"type": "AmpOptimWrapper", "optimizer": {"type": "Adam"},
                                             "clip_grad": {"max_norm": 1}},
                                       "d": {"type": "AmpOptimWrapper", "optimizer": {"type": "Adam"},
                                             "clip_grad": {"max_norm": 1}}}})
    assert amp["precision"] == "16" and amp["clip_grad"] == {"max_norm": 1}


@pytest.mark.parametrize("optim_wrapper, message", [
    ({"constructor": "MultiOptimWrapperConstructor", "g": {"optimizer": {"type": "Adam"}},
      "d": {"optimizer": {"type": "Adam"}, "clip_grad": {"max_norm": 1}}},
     "optim_wrapper.d.clip_grad: differs from optim_wrapper.g.clip_grad (None)"),
    ({"constructor": "MultiOptimWrapperConstructor", "g": {"optimizer": {"type": "Adam"}, "modules": ".*unet"}},
     "optim_wrapper.g.modules: has no treadle equivalent"),
    ({"constructor": "MultiOptimWrapperConstructor", "modules": ["unet"], "optimizer": {"type": "Adam"}},
     "optim_wrapper.modules: is not translated with MultiOptimWrapperConstructor"),
    ({"g": {"optimizer": {"type": "Adam"}}, "d": {"optimizer": {"type": "Adam"}}},
     "optim_wrapper: gives optimizers by name without a constructor"),
    ({"constructor": "MultiOptimWrapperConstructor", "g": {"type": "ApexOptimWrapper", "optimizer": {"type": "Adam"}}},
     "optim_wrapper.g.type: unsupported optimizer wrapper"),
])
def test_what_cannot_be_translated_is_refused_by_its_key(optim_wrapper, message):
    with pytest.raises(ConfigError) as e:
        translate({"optim_wrapper": optim_wrapper})
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def _mmagic_constructor():
    """mmagic's MultiOptimWrapperConstructor, registered in MMEngine's registry."""
    pytest.importorskip("mmengine")
    spec = importlib.util.find_spec("mmagic")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("mmagic is not installed")
    from mmengine import registry

    if "MultiOptimWrapperConstructor" in registry.OPTIM_WRAPPER_CONSTRUCTORS.module_dict:
        return registry.OPTIM_WRAPPER_CONSTRUCTORS.get("MultiOptimWrapperConstructor")
    path = Path(next(iter(spec.submodule_search_locations))) / "engine" / "optimizers" / "multi_optimizer_constructor.py"
    stubs = {"mmagic": types.ModuleType("mmagic"), "mmagic.registry": types.ModuleType("mmagic.registry")}
    for name in ("OPTIM_WRAPPER_CONSTRUCTORS", "OPTIM_WRAPPERS", "OPTIMIZERS"):
        setattr(stubs["mmagic.registry"], name, getattr(registry, name))
    module = load_module_file("mmagic_multi_optimizer_constructor", path, stubs)
    return module.MultiOptimWrapperConstructor


def _options(optimizer, model):
    """{parameter name: its group's options but params}, over one optimizer."""
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: {k: v for k, v in g.items() if k not in ("params", "initial_lr")}
            for g in optimizer.param_groups for p in g["params"]}


def test_each_optimizer_holds_the_parameters_and_options_mmagics_constructor_gives():
    constructor = _mmagic_constructor()
    import copy

    ref = TinyGAN()
    theirs = constructor(copy.deepcopy({k: v for k, v in OPTIM_WRAPPER.items() if k != "constructor"}))(ref)
    cfg = translate({"optim_wrapper": OPTIM_WRAPPER})
    model = TinyGAN()
    trainer = treadle.Trainer(model, optimizer=cfg["optimizer"], strategy=ON_CPU, log_writers=())
    ours = trainer.optim_wrappers
    assert sorted(ours) == sorted(theirs.keys()) == ["discriminator", "generator"]
    compared = 0
    for name in ours:
        mine, their = _options(ours[name].optimizer, model), _options(theirs[name].optimizer, ref)
        for options in (*mine.values(), *their.values()):  # torch's defaults the constructors do not set
            for key in ("foreach", "fused", "capturable", "differentiable", "maximize", "decoupled_weight_decay"):
                options.pop(key, None)
        assert mine == their, name
        compared += len(mine)
    assert compared == len(list(model.parameters())) == 10


def _data():
    g = torch.Generator().manual_seed(0)
    real, noise = torch.randn(12, 4, generator=g) + 2.0, torch.randn(12, 4, generator=g)
    return [{"real": real[i], "noise": noise[i]} for i in range(12)]


def test_a_gan_trained_by_mmengines_runner_and_by_treadle_ends_with_the_same_weights(tmp_path):
    _mmagic_constructor()
    import copy

    from mmengine.runner import Runner

    torch.manual_seed(0)
    start = TinyGAN()
    theirs = copy.deepcopy(start)
    runner = Runner(model=theirs, work_dir=str(tmp_path / "mm"), train_dataloader=DataLoader(_data(), batch_size=3),
                    optim_wrapper=copy.deepcopy(OPTIM_WRAPPER), param_scheduler=[dict(SCHEDULER)],
                    train_cfg=dict(by_epoch=True, max_epochs=2), default_hooks=dict(checkpoint=None, logger=None),
                    default_scope="mmengine", log_level="WARNING")
    runner.train()
    cfg = translate({"optim_wrapper": OPTIM_WRAPPER, "param_scheduler": [SCHEDULER]})
    ours = copy.deepcopy(start)
    treadle.Trainer(ours, train_dataloader=DataLoader(_data(), batch_size=3), optimizer=cfg["optimizer"],
                    schedulers=cfg["schedulers"], max_epochs=2, strategy=ON_CPU, log_writers=(), progress=False).fit()
    for (name, a), b in zip(ours.state_dict().items(), theirs.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, msg=name)
    assert not torch.equal(ours.generator[0].weight, start.generator[0].weight)  # it trained
