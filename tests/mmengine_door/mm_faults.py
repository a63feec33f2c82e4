"""A project's module for the tests' bad inputs, imported through ``custom_imports``: a metric
whose computation fails, registered in MMEngine's METRICS registry as a project registers its own."""

from __future__ import annotations

from typing import ClassVar

from mmengine.evaluator import BaseMetric
from mmengine.registry import METRICS


@METRICS.register_module(force=True)
class FailingMetric(BaseMetric):
    """Keeps one result per batch, then fails to compute."""

    default_prefix = "failing"

    def process(self, data_batch, data_samples) -> None:
        self.results.append(len(data_samples))

    def compute_metrics(self, results) -> dict:
        raise ZeroDivisionError("no samples counted")


from mmengine.logging import MessageHub  # noqa: E402
from mmengine.model import BaseModel  # noqa: E402
from mmengine.registry import MODELS  # noqa: E402
import torch  # noqa: E402


@MODELS.register_module(force=True)
class HubReader(BaseModel):
    """A project model that reads MMEngine's current message hub while it trains (as mmdet's
    TOOD head reads the epoch), recording what it saw."""

    seen: ClassVar[list] = []

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1))

    def forward(self, inputs, data_samples=None, mode="tensor"):
        hub = MessageHub.get_current_instance()
        HubReader.seen.append((hub.get_info("epoch"), hub.get_info("iter"), hub.get_info("max_iters")))
        loss = (self.w * inputs.float()).mean()
        return {"loss": loss} if mode == "loss" else [loss]


from mmengine.optim import DefaultOptimWrapperConstructor  # noqa: E402
from mmengine.registry import OPTIM_WRAPPER_CONSTRUCTORS  # noqa: E402


@OPTIM_WRAPPER_CONSTRUCTORS.register_module(force=True)
class HeadLrTimesTen(DefaultOptimWrapperConstructor):
    """A project's optimizer wrapper constructor: the classifier's parameters at ten times the lr."""

    def add_params(self, params, module, prefix="", is_dcn_module=None) -> None:
        for name, p in module.named_parameters():
            params.append({"params": [p], "lr": self.base_lr * (10 if "classifier" in name else 1)})
