"""Reading config files: YAML, Python, _base_ inheritance, --set overrides."""

from __future__ import annotations

import textwrap

import pytest

from treadle.config import ConfigError, apply_overrides, load_file, merge, parse_override
from treadle.config.loader import parse_yaml


def write(path, text):
    path.write_text(textwrap.dedent(text))
    return path


def test_yaml_reads_exponent_numbers_as_floats():
    # PyYAML alone reads "1e-3" as a string: a learning rate would silently break.
    assert parse_yaml("lr: 1e-3\nwd: 5E-4\nn: 3\nname: '1e-3'") == {"lr": 1e-3, "wd": 5e-4, "n": 3, "name": "1e-3"}


def test_yaml_is_safe(tmp_path):
    with pytest.raises(ConfigError, match="malformed YAML"):
        parse_yaml("x: !!python/object/apply:os.system ['echo hi']")


def test_malformed_yaml_names_line_and_column(tmp_path):
    p = write(tmp_path / "bad.yaml", "model: {type: TinyNet}\noptimizer: [a\n  b: 1\n")
    with pytest.raises(ConfigError) as e:
        load_file(p)
    assert "malformed YAML at line 3, column 4" in str(e.value)
    assert e.value.source == str(p)


def test_missing_file_and_bad_suffix(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        load_file(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="unsupported config file type '.toml'") as e:
        load_file(write(tmp_path / "c.toml", "a = 1"))
    assert str(e.value) == "unsupported config file type '.toml'; expected .yaml or .yml or .py"  # the path: in source
    assert e.value.source == str(tmp_path / "c.toml")
    with pytest.raises(ConfigError, match="top level of a config must be a mapping"):
        load_file(write(tmp_path / "l.yaml", "- 1\n- 2\n"))


def test_a_key_given_twice_is_an_error_naming_it_and_both_lines(tmp_path):
    p = write(tmp_path / "dup.yaml", """\
        model: {type: TinyNet}
        max_epochs: 2
        optimizer: {type: SGD, lr: 0.1}
        max_epochs: 3
        """)
    with pytest.raises(ConfigError) as e:
        load_file(p)
    assert str(e.value).startswith("max_epochs: duplicate key at line 4, column 1 (first given at line 2)")
    assert e.value.source == str(p)
    with pytest.raises(ConfigError, match=r"^lr: duplicate key at line 2, column 3 \(first given at line 1\)"):
        parse_yaml("optimizer: {type: SGD, lr: 0.1,\n  lr: 0.2}")
    with pytest.raises(ConfigError, match=r"^lr: duplicate key at line 3"):
        parse_yaml("optimizer:\n  lr: 0.1\n  lr: 0.2\n")


def test_keys_merged_with_yaml_merge_keys_may_be_overridden():
    text = "base: &b {lr: 0.1, wd: 0.0}\noptimizer:\n  <<: *b\n  lr: 0.2\n"
    assert parse_yaml(text)["optimizer"] == {"lr": 0.2, "wd": 0.0}
    assert parse_yaml("a: 1\nb: {a: 1}\n") == {"a": 1, "b": {"a": 1}}  # the same key in two mappings is fine


def test_python_config_keys(tmp_path):
    write(tmp_path / "helper_mod.py", "class Net:\n    pass\n")
    p = write(tmp_path / "c.py", """
        import math
        from helper_mod import Net   # siblings import: the file's directory is on sys.path
        _hidden = 3
        def _helper():
            return 1
        model = dict(type=Net, width=_hidden * 2)
        max_epochs = int(math.sqrt(16))
    """)
    cfg = load_file(p)
    assert set(cfg) == {"model", "max_epochs"}  # no modules, classes, functions or _names
    assert cfg["model"]["width"] == 6 and cfg["max_epochs"] == 4
    assert cfg["model"]["type"].__name__ == "Net"


def test_python_config_errors_name_the_line(tmp_path):
    with pytest.raises(ConfigError, match=r"running the Python config failed at line 2: NameError"):
        load_file(write(tmp_path / "c.py", "x = 1\ny = undefined\n"))
    with pytest.raises(ConfigError, match=r"Python syntax error at line 1"):
        load_file(write(tmp_path / "s.py", "x = = 1\n"))


def test_base_inheritance_merges_dicts_and_replaces_lists(tmp_path):
    write(tmp_path / "base.yaml", """
        optimizer: {type: AdamW, lr: 0.1, weight_decay: 0.01}
        hooks: [{type: A}, {type: B}]
        val_dataloader: {dataset: {type: d}, batch_size: 8, shuffle: false}
    """)
    write(tmp_path / "mid.py", "_base_ = 'base.yaml'\nmax_epochs = 2\n")
    p = write(tmp_path / "child.yaml", """
        _base_: mid.py
        optimizer: {lr: 0.5}
        hooks: [{type: C}]
        val_dataloader: {_delete_: true, dataset: {type: e}}
    """)
    cfg = load_file(p)
    assert cfg["optimizer"] == {"type": "AdamW", "lr": 0.5, "weight_decay": 0.01}
    assert cfg["hooks"] == [{"type": "C"}]
    assert cfg["val_dataloader"] == {"dataset": {"type": "e"}}
    assert cfg["max_epochs"] == 2


def test_list_of_bases_later_wins(tmp_path):
    write(tmp_path / "a.yaml", "seed: 1\nlog_interval: 5\n")
    write(tmp_path / "b.yaml", "seed: 2\n")
    assert load_file(write(tmp_path / "c.yaml", "_base_: [a.yaml, b.yaml]\n")) == {"seed": 2, "log_interval": 5}


def test_base_errors(tmp_path):
    with pytest.raises(ConfigError, match="base config 'missing.yaml' not found"):
        load_file(write(tmp_path / "c.yaml", "_base_: missing.yaml\n"))
    write(tmp_path / "x.yaml", "_base_: y.yaml\n")
    write(tmp_path / "y.yaml", "_base_: x.yaml\n")
    with pytest.raises(ConfigError, match="inheritance cycle"):
        load_file(tmp_path / "x.yaml")
    with pytest.raises(ConfigError, match="_base_: must be a path or a list of paths"):
        load_file(write(tmp_path / "n.yaml", "_base_: 3\n"))


def test_merge_strips_unused_delete_markers():
    assert merge({}, {"a": {"_delete_": True, "b": 1}}) == {"a": {"b": 1}}


@pytest.mark.parametrize("text, parts, value", [
    ("max_epochs=3", ["max_epochs"], 3),
    ("optimizer.lr=1e-3", ["optimizer", "lr"], 1e-3),
    ("deterministic=true", ["deterministic"], True),
    ("work_dir=null", ["work_dir"], None),
    ("precision=bf16", ["precision"], "bf16"),
    ("precision='16'", ["precision"], "16"),
    ("optimizer.betas=[0.9, 0.99]", ["optimizer", "betas"], [0.9, 0.99]),
    ("clip_grad={max_norm: 1.0}", ["clip_grad"], {"max_norm": 1.0}),
    ("schedulers[1].end=5", ["schedulers", 1, "end"], 5),
    ("schedulers.0.end=5", ["schedulers", 0, "end"], 5),
    ("load_from=", ["load_from"], None),
])
def test_parse_override_types(text, parts, value):
    assert parse_override(text) == (parts, value)


def test_apply_overrides_nested_keys_and_lists():
    cfg = {"optimizer": {"type": "SGD", "lr": 0.1}, "schedulers": [{"type": "A", "end": 3}, {"type": "B"}]}
    out = apply_overrides(cfg, ["optimizer.lr=0.5", "optimizer.momentum=0.9", "schedulers.1.end=7",
                                "clip_grad.max_norm=2", "hooks=[{type: X}]"])
    assert out["optimizer"] == {"type": "SGD", "lr": 0.5, "momentum": 0.9}
    assert out["schedulers"][1] == {"type": "B", "end": 7}
    assert out["clip_grad"] == {"max_norm": 2} and out["hooks"] == [{"type": "X"}]
    assert cfg["optimizer"]["lr"] == 0.1  # the input is not modified


@pytest.mark.parametrize("text, message", [
    ("noequals", "an override must look like KEY=VALUE"),
    ("a..b=1", "empty segment"),
    ("seed=[1", "cannot read the value '[1' as YAML"),
    ("schedulers.5.end=1", "schedulers is a list of 1 items; 5 is not an index"),
    ("seed.x=1", "seed is 3, not a mapping or list"),
    ("hooks.0.x=1", "hooks is not set, so it has no item 0"),
])
def test_override_errors(text, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        apply_overrides({"schedulers": [{"type": "A"}], "seed": 3}, [text])
