"""Version facts the optimizer tests read."""

import torch

TORCH_VERSION = torch.__version__


def mmcv_full_available() -> bool:
    """mmcv's compiled ops are never present next to treadle."""
    return False
