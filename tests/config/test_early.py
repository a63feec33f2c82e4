"""treadle/config/early.py: the config errors found before torch is imported are the full
check's own, and a config the full check takes passes them."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from treadle.config import ConfigError, load_config
from treadle.config.early import check_early, trainer_argument_names
from treadle.config.schema import PROJECT_KEYS, SCHEMA
from treadle.engine.spec import TrainerArgs

ROOT = Path(__file__).resolve().parents[2]


def test_the_argument_names_read_from_the_source_are_the_trainer_s():
    assert trainer_argument_names() == tuple(f.name for f in dataclasses.fields(TrainerArgs))
    assert set(SCHEMA) - {k.name for k in PROJECT_KEYS} <= set(trainer_argument_names())


@pytest.mark.parametrize("config", sorted(str(p.relative_to(ROOT)) for p in (ROOT / "examples").rglob("*.yaml")))
def test_every_example_config_passes(config):
    check_early(ROOT / config)


@pytest.mark.parametrize("text, overrides", [
    ("_base_: {base}\nmax_epoch: 3\n", []),            # a typo of a Trainer argument
    ("_base_: {base}\n", ["max_epoch=3"]),             # the same by --set
    ("_base_: {base}\nmax_epochs: [1\n", []),           # YAML syntax
    ("_base_: nothere.yaml\n", []),                     # a base that does not exist
    ("_base_: {base}\n", ["max_epochs"]),              # a --set without "="
])
def test_an_early_error_is_the_one_the_full_check_raises(tmp_path, text, overrides):
    path = tmp_path / "bad.yaml"
    path.write_text(text.format(base=ROOT / "examples" / "digits" / "digits.yaml"))
    with pytest.raises(ConfigError) as early:
        check_early(path, overrides)
    with pytest.raises(ConfigError) as full:
        load_config(path, overrides, mode="train")
    assert str(early.value) == str(full.value)


def test_mmengine_keys_and_a_python_base_s_variables_are_left_to_the_full_check(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text(f"_base_: {ROOT / 'examples' / 'digits' / 'digits.yaml'}\ntrain_cfg: {{max_epochs: 2}}\n")
    check_early(path)
    (tmp_path / "base.py").write_text("norm_cfg = dict(type='BN')\n")  # a Python base may hold variables
    (tmp_path / "child.yaml").write_text("_base_: base.py\nnorm_cfg: 3\ntrain_cfg: {max_epochs: 2}\n")
    check_early(tmp_path / "child.yaml")


def test_a_yaml_config_has_no_variables(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("max_iters: 200\nmax_iterz: 5\n")
    with pytest.raises(ConfigError, match=r"max_iterz: unknown key \(got 5\).*Did you mean 'max_iters'"):
        check_early(path)
    with pytest.raises(ConfigError, match=r"max_iterz: unknown key \(got 5\).*Did you mean 'max_iters'"):
        load_config(path)  # the full check says the same
    path.write_text("max_iters: 200\nqqq: 3\n")
    with pytest.raises(ConfigError, match=r"qqq: unknown key \(a YAML config has no variables\)"):
        check_early(path)
    path.write_text("max_iters: 200\n_common: 3\n")
    check_early(path)  # scratch, e.g. a place for YAML anchors


@pytest.mark.slow  # a subprocess: the error comes before torch is imported
def test_the_command_line_says_a_config_error_without_importing_torch(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("max_epoch: 3\n")
    code = ("import sys; from treadle.cli import main; rc = main(['train', sys.argv[1]]); "
            "print(rc, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["2", "False"], (out.stdout, out.stderr)
    assert "max_epoch: unknown key" in out.stderr
