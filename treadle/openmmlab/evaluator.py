"""An OpenMMLab project's ``val_evaluator`` / ``test_evaluator``, run as MMEngine's ValLoop and
TestLoop run it, on treadle's evaluation loop.

MMEngine's loop calls ``evaluator.process(data_samples=outputs, data_batch=batch)`` after
each batch's ``val_step`` and ``evaluator.evaluate(len(dataset))`` after the pass: each
metric's per-sample results are collected from every rank, put back in the dataset's order
and cut to the dataset's size (dropping what a padded shard repeated), computed once, and
named ``<prefix>/<name>`` (``accuracy/top1``). :class:`EvaluatorMetric` is that evaluator as
a treadle metric (``update`` / ``compute`` / ``reset``), whose results keep MMEngine's names
(``named_results``: logged as ``val/accuracy/top1``, and ``save_best: accuracy/top1``, early
stopping and ``treadle report`` find them under that name).

On several processes the results are gathered over the data-parallel ranks of the run's
layout (the group ``treadle.metrics.compute`` hands it; under tensor parallelism the ranks
of one group saw the same batches and count once), in memory rather than through files in
the working directory, and computed on the group's first rank only (a metric may write
files), which then gives every rank the values.
"""

from __future__ import annotations

import itertools
from typing import Any, Sized

from treadle.components.errors import ConfigError
from treadle.hints import add_hint
from treadle.openmmlab.mm import import_mmengine


def build_evaluator(spec: Any, scope: Any, path: str) -> Any:
    """MMEngine's ``Evaluator`` for ``spec``, as its Runner's ``build_evaluator`` builds it: a
    mapping with ``metrics`` by the ``EVALUATOR`` registry (type ``Evaluator`` unless given),
    any other mapping or a list as the evaluator's metrics, each by the ``METRICS`` registry."""
    with scope.active():  # without MMEngine: the line naming the extra
        Evaluator = import_mmengine("an evaluator", "evaluator").Evaluator

    if isinstance(spec, Evaluator):
        return spec
    if not isinstance(spec, (dict, list)) or not spec:
        raise ConfigError(path, "not an evaluator spec", value=spec,
                          expected="{type: Accuracy, topk: [1]}, a list of metric specs, or {metrics: [...]}")
    for i, metric in enumerate(spec.get("metrics", []) if isinstance(spec, dict) else spec):
        kind = metric.get("type") if isinstance(metric, dict) else None
        where = f"{path}.metrics[{i}]" if isinstance(spec, dict) else f"{path}[{i}]"
        if isinstance(kind, str) and not scope.knows("metric", kind):  # a class from Python is built as it is
            raise scope.unknown("metric", kind, f"{where}.type")
    kind = spec.get("type") if isinstance(spec, dict) and "metrics" not in spec else None
    if isinstance(kind, str) and not scope.knows("metric", kind):
        raise scope.unknown("metric", kind, f"{path}.type")
    with scope.active() as registry:
        try:
            if isinstance(spec, dict) and "metrics" in spec:
                return registry.EVALUATOR.build({"type": "Evaluator", **spec})
            return Evaluator(spec)
        except Exception as e:
            raise ConfigError(path, f"the evaluator failed to build in scope {scope.name!r}: {type(e).__name__}: {e}") \
                from e


class EvaluatorMetric:
    """An MMEngine ``Evaluator`` as a treadle metric (see the module's docstring).

    Args:
        evaluator: the built ``mmengine.evaluator.Evaluator``.
        dataset: the evaluation set: its size cuts the gathered results, its ``metainfo``
            becomes the evaluator's ``dataset_meta`` (as MMEngine's loops set it).
        name: how errors name it (``val_evaluator``).
    """

    #: compute() names its results (``accuracy/top1``): logged as ``val/<name>`` (treadle.metrics.result_prefix).
    named_results = True

    def __init__(self, evaluator: Any, dataset: Sized, name: str = "val_evaluator") -> None:
        self.evaluator = evaluator
        self.name = name
        self.size = len(dataset)
        meta = getattr(dataset, "metainfo", None)
        if meta is not None:
            evaluator.dataset_meta = meta
        self.group: Any = None  # the data-parallel ranks (sync_over); None: compute()'s, else every process
        #: Each metric's prefix (``accuracy``): its results are ``<prefix>/<name>`` (None: unprefixed).
        self.prefixes = [getattr(m, "prefix", None) for m in evaluator.metrics]

    def sync_over(self, layout: Any) -> None:
        """Gather over ``layout``'s data-parallel ranks (treadle.metrics.place_metrics calls it)."""
        self.group = layout.data_object_group

    def reset(self) -> None:
        for metric in self.evaluator.metrics:
            metric.results.clear()

    def update(self, outputs: Any, batch: Any) -> None:
        """One batch: the model's ``val_step`` outputs (data samples) and the batch."""
        try:
            self.evaluator.process(data_samples=outputs, data_batch=batch)
        except Exception as e:
            raise add_hint(e, f"in {self.name} ({self._names()}): process(data_batch, data_samples) failed on the "
                              "model's val_step outputs")

    def compute(self) -> dict[str, Any]:
        """Every metric's results over the whole evaluation set, named as MMEngine names them."""
        from treadle.distributed.comm import all_gather_object, is_distributed
        from treadle.metrics import computing_group

        if not is_distributed():
            return self._evaluate_here()
        group = computing_group(self.group)
        out: dict[str, Any] = {}
        first = _first_of(group)
        for metric in self.evaluator.metrics:
            parts = all_gather_object(list(metric.results), group=group)
            metric.results.clear()
            values = None
            if first:
                ordered = [r for r in itertools.chain.from_iterable(itertools.zip_longest(*parts)) if r is not None]
                values = self._compute(metric, ordered[:self.size])
            values = next(v for v in all_gather_object(values, group=group) if v is not None)
            _merge(out, values)
        return out

    def _evaluate_here(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for metric in self.evaluator.metrics:
            results = list(metric.results)[:self.size]
            metric.results.clear()
            _merge(out, self._compute(metric, results))
        return out

    def _compute(self, metric: Any, results: list[Any]) -> dict[str, Any]:
        """``metric.compute_metrics(results)`` with its prefix, as ``BaseMetric.evaluate`` names them."""
        if not results:
            from treadle.logging.writers import get_logger

            get_logger().warning(f"{self.name}: {type(metric).__name__} got no results: was process() given the "
                                 "model's val_step outputs?")
        try:
            values = metric.compute_metrics(_to_cpu(results))
        except Exception as e:
            raise add_hint(e, f"in {self.name}: {type(metric).__name__}.compute_metrics(results) failed, over "
                              f"{len(results)} results gathered from every rank")
        prefix = getattr(metric, "prefix", None)
        return {f"{prefix}/{k}" if prefix else k: v for k, v in values.items()}

    def _names(self) -> str:
        return ", ".join(type(m).__name__ for m in self.evaluator.metrics)

    def __repr__(self) -> str:
        return f"EvaluatorMetric({self._names()})"


def _merge(out: dict[str, Any], values: dict[str, Any]) -> None:
    for key, value in values.items():
        if key in out:  # Evaluator.evaluate refuses it the same way
            raise ValueError(f"two metrics of the evaluator give {key!r}: give them different prefixes")
        out[key] = value


def _to_cpu(results: Any) -> Any:
    """Tensors and MMEngine's data elements in ``results`` moved to the CPU (before the metric
    computes, as MMEngine's ``BaseMetric.evaluate`` moves them)."""
    if hasattr(results, "cpu") and callable(results.cpu):  # a tensor, a BaseDataElement
        return results.cpu()
    if isinstance(results, (list, tuple)):
        return type(results)(_to_cpu(r) for r in results)
    if isinstance(results, dict):
        return {k: _to_cpu(v) for k, v in results.items()}
    return results


def _first_of(group: Any) -> bool:
    import torch.distributed as dist

    return dist.get_rank(group) == 0 if group is not None else dist.get_rank() == 0


def evaluator_metric(spec: Any, scope: Any, dataset: Sized, name: str) -> EvaluatorMetric:
    """``val_evaluator`` / ``test_evaluator`` (``name``) built in ``scope`` for ``dataset``."""
    return EvaluatorMetric(build_evaluator(spec, scope, name), dataset, name)


__all__ = ["EvaluatorMetric", "build_evaluator", "evaluator_metric"]
