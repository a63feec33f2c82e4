"""What a hook sees of the run: :class:`RunView`, the one argument of every hook point.

A hook is called as ``hook.after_train_iter(trainer, batch, outputs)``; ``trainer`` is
typed as this Protocol, not as the Trainer, so that a hook depends on the few things
below and nothing else (the Trainer satisfies it; so can any object that runs hooks,
e.g. a test's stand-in). The hooks never import the engine (treadle/engine/), which
imports them.

    state            the counters and last results (TrainState), and ``request_stop()``
    module / model   the user's module, unwrapped / as the strategy wrapped it
    optim_wrappers   the optimizer wrappers by name (``optim_wrapper``: the only one)
    learning_rates   every param group's lr now, keyed as logged
    ema              the averaged module when ``ema=`` is on, else None
    store            the log windows: ``put``/``put_dict``/``extend`` a value, read at
                     the log interval (``flush``); ``latest`` holds the last values read
    strategy         device, world size, reducing logged values over ranks, the full
                     (gathered) model state
    is_main, run_id, work_dir, log_interval
    hooks            the hooks of the run, in priority order (to find a LoggerHook)
    train_loop       where the training loop stands (None without training)
    train_dataloader / val_dataloader / test_dataloader
    checkpoint_path(name), save_checkpoint(path), checkpoint_states(), checkpointer
    update_train_metrics(outputs, targets), log(name, value)
    forward_eval(batch), training_batches(epoch)
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Protocol, Sequence

if TYPE_CHECKING:
    import torch
    from torch import nn

    from treadle.checkpoint.checkpointer import Checkpointer
    from treadle.distributed.layout import ParallelLayout
    from treadle.hooks.state import TrainState
    from treadle.logging.store import MetricStore
    from treadle.optim.wrapper import OptimWrapper


class StrategyView(Protocol):
    """What hooks use of the strategy (treadle/strategies/): where and on how many
    processes the run trains."""

    name: str
    device: torch.device
    world_size: int
    #: The data shards the processes read (the world size without tensor parallelism).
    dp_size: int
    #: How the processes split and the data-parallel groups (treadle/distributed/layout.py).
    layout: ParallelLayout
    async_saves: bool
    #: What ``treadle export`` needs of the model, recorded in every checkpoint's meta.
    model_info: dict[str, Any] | None

    def reduce_log_values(self, values: dict[str, float]) -> dict[str, float]:
        """Several processes: each logged value reduced over the ranks (every rank calls it)."""
        ...

    def get_full_model_state(self, module: nn.Module) -> dict[str, Any]:
        """The module's whole state dict on every rank (FSDP: gathered; a collective)."""
        ...


class LoopView(Protocol):
    """What hooks read of the training loop (treadle/engine/loops.py)."""

    by_epoch: bool
    workflow: Sequence[tuple[str, int | None]]

    @property
    def closing_complete(self) -> bool:
        """True while ``after_train_epoch`` runs for an epoch whose batches all ran."""
        ...

    @property
    def stopped_inside_epoch(self) -> bool:
        """A stop closed the epoch early: a checkpoint taken now resumes inside it."""
        ...

    @property
    def epoch_open(self) -> bool:
        """An epoch has started and not closed (its number is ``state.epoch + 1``)."""
        ...


class RunView(Protocol):
    """The run as every hook point receives it (see the module docstring)."""

    state: TrainState
    module: nn.Module
    model: nn.Module
    optim_wrappers: Mapping[str, OptimWrapper]
    store: MetricStore
    strategy: StrategyView
    work_dir: Path | None
    resume: bool | str | Path  # the Trainer's resume= (True: the newest checkpoint in work_dir, if any)
    log_interval: int
    hooks: Sequence[Any]  # the Hook objects
    train_loop: LoopView | None
    train_dataloader: Any
    val_dataloader: Any
    test_dataloader: Any

    @property
    def optim_wrapper(self) -> OptimWrapper:
        """The optimizer wrapper when there is exactly one."""
        ...

    @property
    def learning_rates(self) -> Mapping[str, float]:
        ...

    @property
    def ema(self) -> nn.Module | None:
        ...

    @property
    def is_main(self) -> bool:
        ...

    @property
    def run_id(self) -> str:
        ...

    @property
    def checkpointer(self) -> Checkpointer:
        ...

    def checkpoint_path(self, name: str) -> Path:
        """Where this run saves the checkpoint it calls ``name`` (never another run's)."""
        ...

    def save_checkpoint(self, path: str | Path, writer: Callable[..., Path] | None = None) -> Path:
        """Save the complete training state at ``path`` (atomic)."""
        ...

    def checkpoint_states(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(states, rank_states)``: the owners of the training state by name."""
        ...

    def update_train_metrics(self, outputs: Any, targets: Any) -> None:
        ...

    def log(self, name: str, value: Any) -> None:
        """Log a scalar (a number or a one-element tensor, kept on its device) into the
        next train record, averaged over its log interval like the losses."""
        ...

    def forward_eval(self, batch: Any) -> Any:
        """The validation step's forward on one batch, without gradients, in the model's
        current mode."""
        ...

    def training_batches(self, epoch: int) -> Iterator[Any]:
        """This process's training batches of epoch ``epoch``, in its order, read through a
        copy of the loader."""
        ...


__all__ = ["LoopView", "RunView", "StrategyView"]
