"""An OpenMMLab project's registries (treadle/openmmlab/scope.py) where MMEngine is not installed
(this suite's .venv): a config whose every type is treadle's runs with its ``default_scope``; a
type only MMEngine's registries could build is one line naming the extra to install; a plain
treadle config's typo keeps treadle's own message. (tests/mmengine_door/ has the rest, with
MMEngine installed.)"""

from __future__ import annotations

import importlib.util

import pytest

from treadle.cli import main
from treadle.components.errors import ConfigError
from treadle.config import build_trainer, load_config
from treadle.openmmlab.mm import INSTALL
from treadle.openmmlab.scope import ProjectScope, check_custom_imports

pytestmark = pytest.mark.skipif(importlib.util.find_spec("mmengine") is not None,
                                reason="MMEngine is installed here (tests/mmengine_door covers that)")

CONFIG = """
default_scope: mmpretrain
model: {type: %s}
loss_fn: {type: CrossEntropyLoss}
train_dataloader: {dataset: {type: support.make_data, n: 8}, batch_size: 4,
                   sampler: {type: DefaultSampler, shuffle: true}}
optimizer: {type: SGD, lr: 0.1}
max_epochs: 1
"""


def test_a_project_config_of_treadle_types_runs_without_mmengine(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(CONFIG % "support.TinyNet")
    trainer = build_trainer(load_config(path, mode="train", work_dir=str(tmp_path / "run")))
    assert trainer.fit() == {}


def test_a_type_only_mmengine_knows_names_the_extra_in_one_line(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(CONFIG % "ImageClassifier")
    assert main(["train", str(path), "--work-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"default_scope 'mmpretrain' (an OpenMMLab project's registries) needs MMEngine, which is "
                        f"not installed: {INSTALL}")
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "run").exists()  # nothing written before a config error


def test_without_a_default_scope_a_typo_keeps_treadles_message(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(CONFIG.replace("default_scope: mmpretrain\n", "") % "DigitsCN")
    with pytest.raises(ConfigError, match=r"model.type: unknown model type \(got 'DigitsCN'\); expected a registered "
                                          r"name \(DigitsCNN, RingGAN\).*Did you mean 'DigitsCNN'"):
        build_trainer(load_config(path, mode="train"))


@pytest.mark.parametrize("spec, message", [
    ({"imports": "x", "allow_failed_imports": "no"}, "custom_imports.allow_failed_imports: not a bool"),
    ({"import": ["x"]}, "custom_imports: not a custom_imports mapping"),
    ({"imports": [3]}, "custom_imports.imports: not a list of module names"),
])
def test_custom_imports_are_checked(spec, message):
    with pytest.raises(ConfigError, match=f"^{message}"):
        check_custom_imports(spec)


def test_a_scope_name_is_checked():
    with pytest.raises(ConfigError, match=r"^default_scope: not a scope name"):
        ProjectScope("")
