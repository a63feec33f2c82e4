"""torch.distributed set-up: launcher inference, process group, rank helpers.

    env = detect_launcher()            # torchrun | slurm | mpi | none
    init_distributed(env, timeout=...) # gloo on CPU, nccl on CUDA; one device per local rank
    comm.all_gather_object(x)          # small objects over a CPU (gloo) group: no device sync
"""

from typing import TYPE_CHECKING, Any

from treadle.lazy import import_submodule

if TYPE_CHECKING:
    from treadle.distributed.env import DistEnv, detect_launcher

# comm's helpers, imported with torch on first use: treadle.distributed.voice (a failure said
# once for the job) and env are needed before torch is (a config error found early); env's
# names on first use too, so that the command line's import of the voice stays small.
_COMM = ("all_gather_object", "barrier", "broadcast_object", "get_rank", "get_world_size", "init_distributed",
         "is_distributed")
_ENV = ("DistEnv", "detect_launcher")

__all__ = ["DistEnv", "detect_launcher", "init_distributed", "is_distributed", "get_rank", "get_world_size",
           "barrier", "broadcast_object", "all_gather_object"]


def __getattr__(name: str) -> Any:
    """comm's helpers, and any submodule (``treadle.distributed.<module>``), on first use."""
    if name in _COMM:
        from treadle.distributed import comm

        return getattr(comm, name)
    if name in _ENV:
        from treadle.distributed import env

        return getattr(env, name)
    return import_submodule(__name__, name)
