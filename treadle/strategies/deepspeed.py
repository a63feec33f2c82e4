"""DeepSpeedStrategy: ZeRO stages 1-3 through a DeepSpeed engine, on treadle's loop and checkpoints.

    strategy = DeepSpeedStrategy(zero_stage=2, config={...raw DeepSpeed entries...},
                                 offload_optimizer=None, offload_param=None)

The flow, as for every strategy (treadle/strategies/api.py)::

    setup()                       process group from the launcher (gloo on CPU; one process: a group of one)
    setup_model(module)           placed on the device, not wrapped yet
    ... prepare builds the OptimWrapper over the module's parameters ...
    setup_optim_wrappers(...)     deepspeed.initialize(module, torch optimizer, config) -> the engine
                                  is the model the loop calls, a DeepSpeedOptimWrapper its optimizer side

The DeepSpeed config is written from treadle's settings (treadle/strategies/deepspeed_config.py).
``deepspeed`` is imported in :meth:`setup` only; ``import treadle`` never imports it, and
DeepSpeed's shared-memory op, built with g++ at every ``initialize`` otherwise, is
switched off (ZeRO training never uses it: only inference all-reduce does).

Checkpoints are treadle's (atomic, verified, ``weights_only``): ``state.pt`` holds the full
weights, gathered with DeepSpeed's ``GatheredParameters`` under stage 3 (so ``treadle
export`` and ``load_from=`` need nothing of DeepSpeed), and each rank's ``rng_rank<r>.pt``
its ZeRO partition: fp32 masters and optimizer state (treadle/strategies/deepspeed_optim.py),
written and read by that rank alone (:meth:`DeepSpeedStrategy.write_checkpoint`).
DeepSpeed's own checkpoint files are never read: its loader unpickles them in full.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

import torch
from torch import nn

from treadle.checkpoint.io import CheckpointError
from treadle.logging.writers import get_logger
from treadle.strategies.api import DEFAULT_REVISE_KEYS
from treadle.strategies.base import ProcessGroupStrategy, move_model, move_to
from treadle.strategies.deepspeed_config import build_config, check_options
from treadle.strategies.materialize import has_meta


@dataclass(eq=False)
class DeepSpeedStrategy(ProcessGroupStrategy):
    """DeepSpeed ZeRO (see the module docstring).

    Args:
        zero_stage: 0 (data parallel), 1 (optimizer state sharded), 2 (+ gradients),
            3 (+ parameters).
        config: raw DeepSpeed config entries merged into treadle's (e.g.
            ``{"zero_optimization": {"stage3_param_persistence_threshold": 0}}``); an
            entry that contradicts a treadle setting is an error naming both.
        offload_optimizer: optimizer state and step on the CPU (stages 1-3); None: as
            ``config`` says (off when it says nothing).
        offload_param: parameters on the CPU (stage 3).
        backend, timeout_s, shard_data, stall_warn_s, stall_timeout_s, empty_init: the options
            every multi-process strategy takes (``ProcessGroupStrategy``); ``sync_bn`` is refused.
    """

    name = "deepspeed"
    async_saves = False  # each rank writes its own partition, at once
    saves_window_grads = False  # they live in ZeRO's buffers

    zero_stage: int = 2
    config: dict[str, Any] | None = None
    offload_optimizer: bool | None = None
    offload_param: bool | None = None

    def __post_init__(self) -> None:
        import importlib.util

        if importlib.util.find_spec("deepspeed") is None:  # said now, not after the processes started
            raise ModuleNotFoundError("strategy='deepspeed' needs the deepspeed package: pip install "
                                      "'treadle[deepspeed]' (DS_BUILD_OPS=0: no op is compiled)")
        super().__post_init__()
        if self.sync_bn:
            raise ValueError("strategy='deepspeed' does not take sync_bn=True (BatchNorm layers inside ZeRO's "
                             "partitions are not synchronized); use strategy='ddp' or 'fsdp' with sync_bn=True")
        self.user_config = check_options(self.zero_stage, self.config, self.offload_optimizer, self.offload_param)
        self.eval_in_lockstep = self.zero_stage == 3  # forward gathers parameters
        self.engine: Any = None
        self.ds_config: dict[str, Any] = {}  # what initialize got (set by setup_optim_wrappers)
        self._half: torch.dtype | None = None  # the module's dtype under bf16/fp16
        self._partitioned_build = False  # ZeRO-3 partitioned the model module by module as it was built
        self._init_config: dict[str, Any] | None = None

    # -- trainer options it cannot honour ----------------------------------------------
    def check_trainer_options(self, options: dict[str, Any]) -> None:
        """Refuse, before anything starts, what the Trainer cannot do on DeepSpeed."""
        if options.get("ema") is not None:
            raise ValueError("ema= is not supported with strategy='deepspeed' (the weights live in ZeRO's "
                             "partitions); use strategy='ddp', or train without EMA")
        if options.get("compile"):
            raise ValueError("compile=True is not supported with strategy='deepspeed' (DeepSpeed compiles through "
                             "its own engine.compile); train without compile")
        checkpoint = options.get("checkpoint")
        if isinstance(checkpoint, dict) and checkpoint.get("async_save") and self.is_main:
            get_logger().warning("checkpoint async_save=True: DeepSpeed's checkpoints are written synchronously "
                                 "(every rank writes its own partition)")

    # -- process group and model ---------------------------------------------------------
    def setup(self) -> None:
        """The process group (one process: a group of one, as DeepSpeed needs one: nccl on
        CUDA, whose tensors ZeRO's collectives then take, as under ``deepspeed.init_distributed``;
        gloo on the CPU), then DeepSpeed's communication on top of it, with no op built."""
        super().setup()
        import torch.distributed as dist

        if not dist.is_initialized():
            import atexit

            from treadle.distributed import comm

            backend = "nccl" if self.device.type == "cuda" else "gloo"
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
            atexit.register(comm.shutdown)
        import os

        os.environ.setdefault("LOCAL_RANK", str(self.local_rank))  # DeepSpeed asserts it is set
        if self.device.type == "cpu":  # else DeepSpeed guesses, and says so
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import deepspeed.ops

        # Built with g++ at every initialize otherwise (about 50 s cold); used only by inference.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False

    @property
    def builds_empty(self) -> bool:
        """ZeRO-3 on several processes builds a model spec on the meta device (each process
        then holds its partition and at most one module whole); ZeRO-0, 1 and 2 keep the
        whole model on every process by design, so they build it whole."""
        if self.empty_init is not None:
            return self.empty_init
        return self.zero_stage == 3 and self.distributed

    def setup_model(self, model: nn.Module) -> nn.Module:
        """Placed on the device; :meth:`setup_optim_wrappers` makes the engine. A model built
        on the meta device is filled module by module under ZeRO-3, each module's parameters
        partitioned as soon as they are filled (DeepSpeed's ``zero.Init`` over that module);
        under ZeRO-0/1/2 it is materialized whole first (DeepSpeed partitions what it
        shards when the engine is made)."""
        if self.zero_stage == 3 and has_meta(model):
            self._partitioned_build = True
            return self.materialize_model(model, each_module=self._partition_module)
        return move_model(self.materialize_model(model), self.device)

    def _partition_module(self, module: nn.Module) -> None:
        """``module``'s own parameters, just filled, made ZeRO-3 partitions (the whole
        values dropped); its buffers stay whole on the device, as the engine keeps them."""
        if all(hasattr(p, "ds_id") for p in module.parameters(recurse=False)):
            return
        import deepspeed

        from treadle.strategies.deepspeed_optim import quiet_deepspeed

        if self._init_config is None:  # what zero.Init reads: the partitioning options alone
            self._init_config = build_config(
                self.user_config, zero_stage=3, offload_optimizer=self.offload_optimizer,
                offload_param=self.offload_param, micro_batch=None, accumulate=1, world_size=self.world_size,
                precision="32", clip_grad=None, device_type=self.device.type)
        with quiet_deepspeed():
            deepspeed.zero.Init(module=module, config_dict_or_path=self._init_config)

    def _cast_partitions(self, model: nn.Module, dtype: torch.dtype) -> None:
        """A model partitioned while it was built, cast to bf16/fp16 as the engine casts a
        whole one before partitioning it (the engine leaves a partitioned model as it is)."""
        with torch.no_grad():
            for p in model.parameters():
                if p.dtype.is_floating_point and p.dtype != dtype:
                    p.ds_tensor.data = p.ds_tensor.data.to(dtype)
                    p.data = p.data.to(dtype)

    def setup_optim_wrappers(self, model: nn.Module, wrappers: dict[str, Any], *,
                             micro_batch: int | None = None) -> tuple[nn.Module, dict[str, Any]]:
        """``deepspeed.initialize`` over ``model`` and the one wrapper's torch optimizer;
        returns the engine and ``{"default": DeepSpeedOptimWrapper}``."""
        import deepspeed

        from treadle.strategies.deepspeed_optim import DeepSpeedOptimWrapper, quiet_deepspeed, use_current_collectives

        if len(wrappers) > 1:
            raise ValueError(f"strategy='deepspeed' trains one optimizer; got {sorted(wrappers)}")
        built = next(iter(wrappers.values()), None)
        if built is not None and built.loss_scale != "dynamic":
            raise ValueError(f"loss_scale={built.loss_scale!r} under strategy='deepspeed': DeepSpeed scales fp16 "
                             "losses itself; set fp16.loss_scale (and initial_scale_power) in its config instead")
        self.ds_config = build_config(
            self.user_config, zero_stage=self.zero_stage, offload_optimizer=self.offload_optimizer,
            offload_param=self.offload_param, micro_batch=micro_batch,
            accumulate=built.accumulate if built is not None else 1, world_size=self.world_size,
            precision=built.precision if built is not None else "32",
            clip_grad=built.clip_grad if built is not None else None, device_type=self.device.type)
        half = (torch.bfloat16 if self.ds_config["bf16"]["enabled"] else
                torch.float16 if self.ds_config["fp16"]["enabled"] else None)
        if self._partitioned_build and half is not None:
            self._cast_partitions(model, half)
        with quiet_deepspeed():
            self.engine, *_ = deepspeed.initialize(model=model, config=self.ds_config,
                                                   optimizer=built.optimizer if built is not None else None)
        use_current_collectives()
        import deepspeed.comm

        from treadle.distributed import comm

        comm.destroy_world_with(deepspeed.comm.destroy_process_group)  # it forgets DeepSpeed's own groups too
        self._half = half
        if built is None:
            return self.engine, {}
        return self.engine, {name: DeepSpeedOptimWrapper(self.engine, built) for name in wrappers}

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model.module if self.engine is not None and model is self.engine else model

    def eval_model(self, model: nn.Module) -> nn.Module:
        """The module itself (stage 3's forward hooks gather its parameters)."""
        return self.unwrap(model)

    def batch_mover(self) -> Any:
        """Floating-point tensors to bf16/fp16 under bf16/fp16 (the engine's weights are),
        and to the device."""
        if self._half is None:
            return super().batch_mover()
        device, dtype = self.device, self._half
        return lambda batch: move_to(batch, device, device.type == "cuda", dtype)

    # -- state dicts -----------------------------------------------------------------------
    @contextlib.contextmanager
    def _gathered(self, module: nn.Module, modifier_rank: int | None = None) -> Iterator[None]:
        """Stage 3: every parameter whole inside (DeepSpeed's ``GatheredParameters``, a collective)."""
        if self.zero_stage != 3 or self.engine is None:
            yield
            return
        import deepspeed

        from treadle.strategies.deepspeed_optim import quiet_deepspeed

        with quiet_deepspeed(), deepspeed.zero.GatheredParameters(list(module.parameters()),
                                                                  modifier_rank=modifier_rank):
            yield

    def full_shapes(self, module: nn.Module) -> dict[str, tuple[int, ...]]:
        shapes = super().full_shapes(module)
        if self.zero_stage == 3 and self.engine is not None:  # the local parameters are placeholders
            shapes.update({k: tuple(p.ds_shape) for k, p in module.named_parameters() if hasattr(p, "ds_shape")})
        return shapes

    def get_model_state(self, module: nn.Module) -> dict[str, Any]:
        """Full weights (stage 3: gathered, a collective), bf16 under bf16."""
        with self._gathered(module):
            return {k: v.detach().clone() for k, v in module.state_dict().items()}

    get_full_model_state = get_model_state

    def set_model_state(self, module: nn.Module, state: dict[str, Any], *, strict: bool = True) -> None:
        """Full weights into the module (stage 3: into every rank's partition), then the fp32
        masters refreshed from them."""
        with self._gathered(module, modifier_rank=0):
            module.load_state_dict(state, strict=strict)
        self._refresh_masters()

    def load_full_model_state(self, module: nn.Module, state: Any, *, strict: bool = False,
                              revise_keys: Any = DEFAULT_REVISE_KEYS, frozen: Any = None) -> Any:
        with self._gathered(module, modifier_rank=0):
            report = super().load_full_model_state(module, state, strict=strict, revise_keys=revise_keys,
                                                   frozen=frozen)
        self._refresh_masters()
        return report

    def _refresh_masters(self) -> None:
        optimizer = getattr(self.engine, "optimizer", None)
        if optimizer is not None and hasattr(optimizer, "refresh_fp32_params"):
            optimizer.refresh_fp32_params()

    def get_optim_state(self, module: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The shared part: how the partitions were cut (each rank's own file holds its
        partition, see DeepSpeedOptimWrapper.local_state_dict)."""
        return {"zero_stage": self.zero_stage, "world_size": self.world_size}

    def set_optim_state(self, module: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        self.check_optim_state(state)

    def check_optim_state(self, state: Any) -> None:
        """A ZeRO partition fits only the stage and number of processes that cut it."""
        saved = (state.get("zero_stage"), state.get("world_size")) if isinstance(state, dict) else None
        if saved != (self.zero_stage, self.world_size):
            what = (f"ZeRO stage {saved[0]} on {saved[1]} process(es)" if saved and saved[0] is not None
                    else "another strategy")
            raise CheckpointError(f"the checkpoint's optimizer state was saved by {what}; this run has ZeRO stage "
                                  f"{self.zero_stage} on {self.world_size}: resume needs the same (load_from= "
                                  "takes the weights alone)")


    # -- checkpoints -----------------------------------------------------------------------
    def write_checkpoint(self, path: str | Path, payloads: dict[str, Any], meta: dict[str, Any],
                         writer: Any = None, sharded: Iterable[str] = ()) -> Path:
        """A treadle checkpoint directory in which every rank writes its own
        ``rng_rank<r>.pt`` (its ZeRO partition: nothing is gathered), rank 0 ``state.pt``
        and, once every file is durable, the manifest (a collective). Synchronous
        (:attr:`async_saves` is False: no ``writer`` is handed here)."""
        from treadle.checkpoint.checkpointer import rng_file
        from treadle.checkpoint.sharded import save_sharded

        own = rng_file(self.rank)
        shared = {k: v for k, v in payloads.items() if k != own}
        save_sharded(path, {}, shared, meta, rank_files={own: payloads[own]})
        return Path(path)

    def read_checkpoint(self, path: str | Path, template: Any = None) -> dict[str, Any]:
        """``state.pt`` and this rank's own file only (verified, weights_only)."""
        from treadle.checkpoint.checkpointer import rng_file
        from treadle.checkpoint.io import load_checkpoint
        from treadle.checkpoint.manifest import STATE_FILE, read_manifest

        own = rng_file(self.rank)
        if not Path(path).is_dir():  # a single file: what it holds (its checks refuse it)
            return load_checkpoint(path)
        files = [STATE_FILE, own] if own in read_manifest(path)["files"] else [STATE_FILE]
        return load_checkpoint(path, files=files)


__all__ = ["DeepSpeedStrategy"]
