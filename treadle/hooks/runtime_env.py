"""RuntimeEnvHook: process settings for a run (cuDNN autotuning, torch's CPU threads, the
start method of data-loader workers, OpenCV's threads, the open-file limit, the level of
treadle's logger), set before it and put
back after it (the open-file limit stays raised). MMEngine's ``env_cfg`` is
translated to this hook."""

from __future__ import annotations

import importlib.util
import logging
import multiprocessing
import sys
from typing import TYPE_CHECKING, Any

import torch

from treadle.hooks.base import Hook, Priority
from treadle.logging.writers import LOGGER_NAME

if TYPE_CHECKING:
    from treadle.hooks.view import RunView

START_METHODS = ("fork", "spawn", "forkserver")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class RuntimeEnvHook(Hook):
    """Settings applied at ``before_run`` and restored at ``after_run`` (the open-file
    limit aside).

    Args:
        cudnn_benchmark: ``torch.backends.cudnn.benchmark`` (cuDNN picks the fastest
            convolution algorithm for each input shape; results may then differ run to
            run). None: left as it is.
        torch_num_threads: ``torch.set_num_threads`` (the threads of CPU operators): 1
            for a model too small to gain from more, which on a machine shared with other
            work also stops idle threads from spinning. None: left as it is.
        mp_start_method: how data-loader workers start: "fork", "spawn" or
            "forkserver" (``multiprocessing.set_start_method``). None: left as it is.
        opencv_num_threads: ``cv2.setNumThreads`` when OpenCV is installed (0: no
            threads of its own, so N loader workers do not start N thread pools).
        open_files: raise the soft limit of open files (RLIMIT_NOFILE) to at least
            this, within the hard limit; never lowers it.
        log_level: the level of the ``treadle`` logger (console and ``log.txt``): one of
            :data:`LOG_LEVELS`. Messages of the Trainer's construction, before the run,
            keep the level it had.
    """

    priority = Priority.VERY_HIGH

    def __init__(self, cudnn_benchmark: bool | None = None, mp_start_method: str | None = None,
                 opencv_num_threads: int | None = None, open_files: int | None = None,
                 log_level: str | None = None, torch_num_threads: int | None = None) -> None:
        if cudnn_benchmark is not None and not isinstance(cudnn_benchmark, bool):
            raise TypeError(f"RuntimeEnvHook cudnn_benchmark must be true, false or null, got {cudnn_benchmark!r}")
        if mp_start_method is not None and mp_start_method not in START_METHODS:
            raise ValueError(f"RuntimeEnvHook mp_start_method={mp_start_method!r}; expected one of {START_METHODS}")
        for name, value in (("opencv_num_threads", opencv_num_threads), ("open_files", open_files)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"RuntimeEnvHook {name} must be an int >= 0 or null, got {value!r}")
        if torch_num_threads is not None and (isinstance(torch_num_threads, bool) or not isinstance(torch_num_threads, int)
                                              or torch_num_threads < 1):
            raise ValueError(f"RuntimeEnvHook torch_num_threads must be an int >= 1 or null, got {torch_num_threads!r}")
        self.torch_num_threads = torch_num_threads
        if mp_start_method is not None and mp_start_method not in multiprocessing.get_all_start_methods():
            raise ValueError(f"RuntimeEnvHook mp_start_method={mp_start_method!r} is not available on "
                             f"{sys.platform}; expected one of {multiprocessing.get_all_start_methods()}")
        if log_level is not None and log_level not in LOG_LEVELS:
            raise ValueError(f"RuntimeEnvHook log_level={log_level!r}; expected one of {LOG_LEVELS}")
        self.log_level = log_level
        self.cudnn_benchmark = cudnn_benchmark
        self.mp_start_method = mp_start_method
        self.opencv_num_threads = opencv_num_threads
        self.open_files = open_files
        self._saved: dict[str, Any] = {}

    def before_run(self, trainer: "RunView") -> None:
        saved = self._saved
        if self.log_level is not None:
            logger = logging.getLogger(LOGGER_NAME)
            saved["log_level"] = logger.level
            logger.setLevel(self.log_level)
        if self.torch_num_threads is not None:
            saved["torch_num_threads"] = torch.get_num_threads()
            torch.set_num_threads(self.torch_num_threads)
        if self.cudnn_benchmark is not None:
            saved["cudnn_benchmark"] = torch.backends.cudnn.benchmark
            torch.backends.cudnn.benchmark = self.cudnn_benchmark
        if self.mp_start_method is not None:
            saved["mp_start_method"] = multiprocessing.get_start_method(allow_none=True)
            multiprocessing.set_start_method(self.mp_start_method, force=True)
        cv2 = _opencv() if self.opencv_num_threads is not None else None
        if cv2 is not None:
            saved["opencv_num_threads"] = cv2.getNumThreads()
            cv2.setNumThreads(self.opencv_num_threads)
        if self.open_files is not None and sys.platform != "win32":
            import resource

            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            wanted = self.open_files if hard == resource.RLIM_INFINITY else min(self.open_files, hard)
            if soft != resource.RLIM_INFINITY and wanted > soft:
                resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))

    def after_run(self, trainer: "RunView") -> None:
        saved, self._saved = self._saved, {}
        if "log_level" in saved:
            logging.getLogger(LOGGER_NAME).setLevel(saved["log_level"])
        if "torch_num_threads" in saved:
            torch.set_num_threads(saved["torch_num_threads"])
        if "cudnn_benchmark" in saved:
            torch.backends.cudnn.benchmark = saved["cudnn_benchmark"]
        if "mp_start_method" in saved:
            multiprocessing.set_start_method(saved["mp_start_method"], force=True)
        if "opencv_num_threads" in saved:
            _opencv().setNumThreads(saved["opencv_num_threads"])


def _opencv() -> Any:
    """The ``cv2`` module, or None when OpenCV is not installed (then there is nothing to set)."""
    if "cv2" not in sys.modules and importlib.util.find_spec("cv2") is None:
        return None
    import cv2

    return cv2


__all__ = ["LOG_LEVELS", "RuntimeEnvHook", "START_METHODS"]
