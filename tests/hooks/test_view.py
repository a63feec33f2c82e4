"""Hooks see the run through RunView (treadle/hooks/view.py), never the Trainer."""

import ast
import pathlib

import torch

import treadle
from treadle.hooks.logger import LoggerHook
from treadle.hooks.view import LoopView, RunView, StrategyView
from treadle.logging.store import MetricStore

from support import TinyNet, make_data

HOOKS = pathlib.Path(treadle.__file__).parent / "hooks"


def _members(protocol: type) -> set[str]:
    names = set(getattr(protocol, "__annotations__", {}))
    names |= {n for n in vars(protocol) if not n.startswith("_")}
    return names


def _attribute_chains(tree: ast.AST, root: str) -> set[tuple[str, ...]]:
    """Every ``root.a`` and ``root.a.b`` read in the tree."""
    chains = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            parts = []
            inner: ast.AST = node
            while isinstance(inner, ast.Attribute):
                parts.append(inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name) and inner.id == root:
                chains.add(tuple(reversed(parts)))
    return chains


def test_no_hook_module_imports_the_engine():
    for path in HOOKS.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith("treadle.engine"), f"{path.name} imports {node.module}"
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("treadle.engine") for a in node.names), path.name


def test_hooks_use_only_what_the_view_offers():
    run, strategy, loop = _members(RunView), _members(StrategyView), _members(LoopView)
    offered = {"strategy": strategy, "train_loop": loop}
    used = set()
    for path in HOOKS.glob("*.py"):
        if path.name == "view.py":
            continue
        for chain in _attribute_chains(ast.parse(path.read_text()), "trainer"):
            used.add(chain[0])
            assert chain[0] in run, f"{path.name}: trainer.{chain[0]} is not part of RunView"
            if chain[0] in offered and len(chain) > 1:
                assert chain[1] in offered[chain[0]], f"{path.name}: trainer.{'.'.join(chain[:2])} is not in the view"
    assert {"state", "store", "strategy", "module", "is_main"} <= used  # the scan sees the hooks' reads


def test_the_trainer_offers_every_member_of_the_view():
    trainer = treadle.Trainer(TinyNet(), train_dataloader=make_data(n=8), max_iters=1,
                              optimizer=dict(type="SGD", lr=0.1), strategy="single", progress=False)
    for name in _members(RunView):
        assert hasattr(trainer, name), name
    for name in _members(StrategyView):
        assert hasattr(trainer.strategy, name), name
    for name in _members(LoopView):
        assert hasattr(trainer.train_loop, name), name


class _Stand:
    """Not a Trainer: the few members of RunView the LoggerHook's train record reads."""

    def __init__(self, tmp_path):
        self.state = treadle.TrainState(max_iters=2, by_epoch=False)
        self.store = MetricStore()
        self.optim_wrappers = {}
        self.learning_rates = {"lr": 0.5}
        self.work_dir = tmp_path
        self.resume = False
        self.is_main = True
        self.train_dataloader = None

        class _Strategy:
            device = torch.device("cpu")
            world_size = 1

            @staticmethod
            def reduce_log_values(values):
                return values
        self.strategy = _Strategy()


def test_a_hook_runs_against_any_object_that_offers_the_view(tmp_path):
    run = _Stand(tmp_path)
    hook = LoggerHook(interval=2, writers=("jsonl",), text_log=False)
    seen = []
    hook.add_listener(lambda t, values: seen.append(values))
    hook.add_source(lambda t: {"extra": 7})
    hook.before_run(run)
    hook.before_train(run)
    record_step, _ = run.store.recorders()  # as the loop does: it records each step's outputs
    for i, loss in enumerate((1.0, 3.0)):
        run.state.iter = i
        outputs = {"loss": torch.tensor(loss)}
        record_step((i, 0, outputs))
        hook.after_train_iter(run, None, outputs)
    hook.after_run(run)
    record = (tmp_path / "log.jsonl").read_text().splitlines()
    assert len(record) == 1 and '"loss": 2.0' in record[0] and '"extra": 7' in record[0]
    assert seen[0] == {"loss": 2.0}


def test_adding_the_same_source_twice_adds_it_once(tmp_path):
    run = _Stand(tmp_path)
    hook = LoggerHook(interval=1, writers=("jsonl",), text_log=False)
    calls = []

    def source(t):
        calls.append(1)
        return {}
    hook.add_source(source)
    hook.add_source(source)
    hook.before_run(run)
    hook.before_train(run)
    run.state.iter = 0
    hook.after_train_iter(run, None, {"loss": torch.tensor(1.0)})
    hook.after_run(run)
    assert calls == [1]


def test_metric_store_windows_are_changed_only_through_its_methods():
    store = MetricStore()
    store.put("a", 1.0)
    store.extend("a", [2.0, 3.0, 4.0])
    store.put_dict({"b": torch.tensor(10.0)})
    assert store.window("a") == [1.0, 2.0, 3.0, 4.0] and store.window("missing") == []
    store.window("a").clear()  # a copy: the store keeps its values
    store.keep_last(2)
    assert store.flush() == {"a": 3.5, "b": 10.0}
    assert store.window("a") == [] and store.latest == {"a": 3.5, "b": 10.0}
