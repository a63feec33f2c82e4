"""What a checkpoint records of its model for ``treadle export`` (treadle/checkpoint/model_info.py)."""

from __future__ import annotations

import enum
import json
import math

import torch
from torch import nn

from treadle.checkpoint.model_info import describe_model, json_safe, tied_keys


class Shared(nn.Module):
    """Two layers sharing one weight, neither declared tied."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 3, bias=False)
        self.b = nn.Linear(3, 3, bias=False)
        self.b.weight = self.a.weight
        self.register_buffer("scale", torch.ones(2, dtype=torch.float16))


def test_a_plain_module_records_its_class_tensors_and_aliases():
    info = describe_model(Shared())
    assert info == {"class": f"{__name__}.Shared", "tied": {"b.weight": "a.weight"},
                    "tensors": {"a.weight": ["float32", [3, 3]], "b.weight": ["float32", [3, 3]],
                                "scale": ["float16", [2]]}}
    assert json.loads(json.dumps(info, allow_nan=False)) == info  # as the manifest stores it


def test_declared_tied_keys_are_the_ones_dropped():
    model = Shared()
    model._tied_weights_keys = {"a.weight": "b.weight"}  # as a Hugging Face model declares its head
    assert tied_keys(model) == {"a.weight": "b.weight"}


def test_json_safe_keeps_what_json_holds_and_names_the_rest():
    class Kind(str, enum.Enum):
        LORA = "LORA"

    value = {"t": {"b", "a"}, "k": Kind.LORA, "d": torch.bfloat16, "x": (1, math.inf), "n": None, "o": object}
    assert json_safe(value) == {"t": ["a", "b"], "k": "LORA", "d": "bfloat16", "x": [1, "inf"], "n": None,
                                "o": str(object)}
