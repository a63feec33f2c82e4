"""Bad input to an OpenMMLab project's run, through ``treadle train`` on the released
lenet5_mnist.py with one command-line change each: one line naming what was wrong and what
was expected, and nothing written to the work_dir before a config error."""

from __future__ import annotations

import pytest

from treadle.cli import main

LENET = "configs/lenet/lenet5_mnist.py"


@pytest.fixture
def in_work(mm_work, monkeypatch, tmp_path):
    monkeypatch.chdir(mm_work)
    return tmp_path / "run"


def train(run, *sets: str) -> int:
    return main(["train", LENET, "--work-dir", str(run), "--seed", "0", "--set", "train_cfg.max_epochs=1", *sets])


def last_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    return err[-1] if err else ""


@pytest.mark.parametrize("override, line, close", [
    ("model.type=ImageClasifier", "model.type: unknown model type in scope 'mmpretrain' (got 'ImageClasifier'); "
     "expected a name of MMEngine's MODELS registry in scope 'mmpretrain'", "ImageClassifier"),
    ("train_dataloader.dataset.type=MINST", "train_dataloader.dataset.type: unknown dataset type in scope "
     "'mmpretrain' (got 'MINST')", "MNIST"),
    ("val_evaluator={type: Acuracy}", "val_evaluator.type: unknown metric type in scope 'mmpretrain' (got "
     "'Acuracy')", "Accuracy"),
])
def test_a_type_unknown_in_the_scope_names_the_scope_the_registry_and_close_names(in_work, capsys, override, line,
                                                                                   close):
    assert train(in_work, override) == 2
    said = last_line(capsys)
    assert line in said and f"Did you mean '{close}'" in said
    assert not in_work.exists()  # nothing written before a config error


def test_a_custom_import_that_does_not_import_names_it(in_work, capsys):
    assert train(in_work, "custom_imports={imports: [my_project.no_such_module]}") == 2
    line = last_line(capsys)
    assert "custom_imports.imports[0]: cannot import 'my_project.no_such_module': ModuleNotFoundError" in line
    assert not in_work.exists()


def test_an_evaluator_that_fails_names_its_class(in_work, capsys):
    code = train(in_work, "custom_imports={imports: [mm_faults]}", "val_evaluator={type: FailingMetric}")
    assert code == 1
    said = capsys.readouterr().err
    assert "treadle train: error in validation (after 4 training iterations): ZeroDivisionError: no samples " \
           "counted" in said
    assert "treadle: in val_evaluator: FailingMetric.compute_metrics(results) failed, over 2 results gathered" in said


def test_safe_mode_refuses_custom_imports_before_anything_runs(in_work, capsys, tmp_path):
    yaml = tmp_path / "c.yaml"
    yaml.write_text("default_scope: mmpretrain\ncustom_imports: {imports: [mm_faults]}\nmodel: {type: ImageClassifier}\n"
                    "train_dataloader: {dataset: {type: MNIST, data_prefix: data/mnist}}\nmax_epochs: 1\n"
                    "optimizer: {type: SGD, lr: 0.1}\n")
    assert main(["train", str(yaml), "--safe", "--work-dir", str(in_work)]) == 2
    assert "custom_imports: safe mode imports no module a config names" in last_line(capsys)


def test_an_optimizer_of_the_projects_registry_is_built_over_the_model(in_work):
    from treadle.config import build_trainer, load_config

    cfg = load_config(LENET, ["optim_wrapper.optimizer={type: Lamb, lr: 0.001}"], mode="train",
                      work_dir=str(in_work))
    trainer = build_trainer(cfg)
    assert type(trainer.optimizer).__module__.startswith("mmpretrain.") and type(trainer.optimizer).__name__ == "Lamb"
    assert trainer.optimizer.param_groups[0]["lr"] == 0.001


def test_a_projects_optimizer_constructor_builds_the_groups_mmengine_builds(in_work):
    import mm_faults  # noqa: F401 - registers HeadLrTimesTen
    from mmengine.optim import build_optim_wrapper

    from treadle.config import build_trainer, load_config

    cfg = load_config(LENET, ["optim_wrapper.constructor=HeadLrTimesTen", "optim_wrapper.paramwise_cfg.bias_lr_mult=1"],
                      mode="train", work_dir=str(in_work))  # MMEngine's constructors call add_params with a paramwise_cfg
    assert cfg["optim_constructor"] == {"type": "HeadLrTimesTen", "paramwise_cfg": {"bias_lr_mult": 1}}
    trainer = build_trainer(cfg)
    theirs = build_optim_wrapper(trainer.module, {"type": "OptimWrapper", "constructor": "HeadLrTimesTen",
                                                  "paramwise_cfg": {"bias_lr_mult": 1},
                                                  "optimizer": {"type": "SGD", "lr": 0.01, "momentum": 0.9,
                                                                "weight_decay": 0.0001}}).optimizer
    ours = trainer.optimizer.param_groups
    assert [g["lr"] for g in ours] == [g["lr"] for g in theirs.param_groups] and {g["lr"] for g in ours} == {0.01, 0.1}
    assert [[p.shape for p in g["params"]] for g in ours] == [[p.shape for p in g["params"]] for g in theirs.param_groups]
    assert all(p is q for g, h in zip(ours, theirs.param_groups) for p, q in zip(g["params"], h["params"]))
    trainer.fit()  # one epoch trains with those groups
