"""The optimizer-name lists MMEngine's builder exposes: here, what treadle builds by name."""

from treadle.optim.builder import optimizer_names

TORCH_OPTIMIZERS = ["Optimizer", *optimizer_names()]
DADAPTATION_OPTIMIZERS: list = []
LION_OPTIMIZERS: list = []
BITSANDBYTES_OPTIMIZERS: list = []
TRANSFORMERS_OPTIMIZERS: list = []
