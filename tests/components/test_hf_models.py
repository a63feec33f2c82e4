"""Hugging Face models from config files: ``type: transformers.X`` with ``config: {...}`` (the
config class's arguments) or ``pretrained: PATH`` (local weights, nothing downloaded)."""

from __future__ import annotations

import pytest
import torch

from treadle.config import ConfigError, build_trainer, load_config
from treadle.components.build import build_model
from treadle.seeding import seed_everything

transformers = pytest.importorskip("transformers")

BERT = dict(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
            max_position_embeddings=16, num_labels=2)

YAML = """
model:
  type: transformers.BertForSequenceClassification
  config: {vocab_size: 40, hidden_size: 16, num_hidden_layers: 1, num_attention_heads: 2, intermediate_size: 32,
           max_position_embeddings: 16, num_labels: 2}
train_dataloader: {dataset: {type: support.labelled_texts, n: 8}, batch_size: 4}
optimizer: {type: AdamW, lr: 1.0e-3}
max_iters: 2
seed: 3
progress: false
"""


def test_a_yaml_config_builds_the_model_from_its_config_class_and_trains(tmp_path):
    path = tmp_path / "bert.yaml"
    path.write_text(YAML)
    trainer = build_trainer(load_config(path, mode="train", work_dir=str(tmp_path / "w")))
    model = trainer.module
    assert type(model) is transformers.BertForSequenceClassification and model.config.hidden_size == 16
    seed_everything(3)  # what the config's build did first: the same initial weights by hand
    by_hand = transformers.BertForSequenceClassification(transformers.BertConfig(**BERT))
    for (name, a), b in zip(by_hand.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), name
    trainer.fit()
    assert trainer.state.iter == 2


def test_an_auto_class_takes_the_model_type():
    model = build_model({"type": "transformers.AutoModelForSequenceClassification",
                         "config": {"model_type": "bert", **BERT}})
    assert type(model) is transformers.BertForSequenceClassification and model.config.num_labels == 2


def test_pretrained_loads_local_weights_and_config_overrides_the_saved_values(tmp_path):
    saved = transformers.BertForSequenceClassification(transformers.BertConfig(**BERT))
    saved.save_pretrained(tmp_path / "bert")
    model = build_model({"type": "transformers.BertForSequenceClassification", "pretrained": str(tmp_path / "bert"),
                         "config": {"classifier_dropout": 0.25}})
    assert model.config.classifier_dropout == 0.25
    for (name, a), b in zip(saved.state_dict().items(), model.state_dict().values()):
        assert torch.equal(a, b), name
    auto = build_model({"type": "transformers.AutoModelForSequenceClassification", "pretrained": str(tmp_path / "bert")})
    assert torch.equal(auto.classifier.weight, saved.classifier.weight)


@pytest.mark.parametrize("spec, message", [
    ({"config": {**BERT, "hiden_size": 8}},
     r"^model\.config\.hiden_size: unknown argument for BertConfig \(got 8\); expected arguments among .* Did you "
     r"mean 'hidden_size'"),
    ({}, r"^model: a transformers model \(BertForSequenceClassification\) needs config: \{\.\.\.\} \(fresh weights\) "
         r"or pretrained: PATH"),
    ({"config": [1]}, r"^model\.config: not a mapping"),
    ({"pretrained": "bert-base-uncased"}, r"^model\.pretrained: no such local file or directory \(got "
                                          r"'bert-base-uncased'\).* treadle downloads nothing"),
    ({"config": BERT, "pretrain": "x"}, r"^model\.pretrain: not a key of a transformers model spec .* Did you mean "
                                        r"'pretrained'\?"),
    ({"config": {**BERT, "num_attention_heads": 3}}, r"^model(\.config)?: .*failed: ValueError: .*hidden size"),
])
def test_errors_are_one_line_naming_the_key(spec, message):
    with pytest.raises(ConfigError, match=message) as info:
        build_model({"type": "transformers.BertForSequenceClassification", **spec})
    assert "\n" not in str(info.value)


def test_an_auto_class_without_a_model_type_is_told_what_to_add():
    with pytest.raises(ConfigError, match=r"^model\.config\.model_type: AutoModelForSequenceClassification needs the "
                                          r"model type"):
        build_model({"type": "transformers.AutoModelForSequenceClassification", "config": BERT})


def test_safe_mode_refuses_the_dotted_type_before_importing_it(tmp_path):
    path = tmp_path / "bert.yaml"
    path.write_text(YAML)
    with pytest.raises(ConfigError, match=r"^model\.type: safe mode allows only registered names"):
        load_config(path, safe=True)


def test_a_pretrained_directory_with_remote_code_is_not_run(tmp_path):
    """A saved config that asks for code of its own (auto_map) is refused, never imported."""
    saved = transformers.BertForSequenceClassification(transformers.BertConfig(**BERT))
    saved.save_pretrained(tmp_path / "m")
    (tmp_path / "m" / "evil.py").write_text("raise SystemExit('ran code from a checkpoint')\n")
    cfg = (tmp_path / "m" / "config.json").read_text()
    (tmp_path / "m" / "config.json").write_text(cfg.replace('"model_type"', '"auto_map": {"AutoModelForSequence'
                                                                          'Classification": "evil.Model"}, "model_type"', 1))
    model = build_model({"type": "transformers.AutoModelForSequenceClassification", "pretrained": str(tmp_path / "m")})
    assert type(model) is transformers.BertForSequenceClassification  # the library's own class: evil.py never ran
