"""tests/mmengine_door: MMEngine's own Runner on released mmpretrain configs (``mm_reference.py``),
the numbers that treadle's door for OpenMMLab projects (``treadle/mmengine/``) is compared with.

``make test-mm`` runs them, with MMEngine, mmcv-lite, mmpretrain and torchvision on PYTHONPATH
(``.venv/openmmlab``) and ``env/`` (its ``sitecustomize.py``: a workaround of the test environment,
not of treadle). Where ``mmpretrain.datasets`` does not import (``.venv`` itself, which has no
MMEngine), every test of this folder skips.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # mm_data, mm_reference: imported by the tests and fixtures of this folder


@pytest.fixture(scope="session")
def mm_importable() -> None:
    """Skips unless ``mmpretrain.datasets`` imports here."""
    if importlib.util.find_spec("mmpretrain") is None:
        pytest.skip("mmpretrain is not installed (make test-mm installs it into .venv/openmmlab)")
    try:
        import mmpretrain.datasets  # noqa: F401
    except Exception as e:
        pytest.skip(f"mmpretrain.datasets does not import: {type(e).__name__}: {e}")


@pytest.fixture(autouse=True)
def _skip_without_mm(mm_importable: None) -> None:
    """Every test of this folder needs the OpenMMLab packages."""


@pytest.fixture(scope="session")
def mm_work(tmp_path_factory: pytest.TempPathFactory, mm_importable: None) -> Path:
    """A work folder where released configs run unchanged: ``data/`` (``mm_data.write``, seed 0),
    and ``configs`` linked to the installed ``mmpretrain/.mim/configs``."""
    import mm_data

    work = tmp_path_factory.mktemp("mm_work")
    mm_data.write(work / "data", seed=0)
    configs = Path(importlib.util.find_spec("mmpretrain").origin).parent / ".mim" / "configs"
    (work / "configs").symlink_to(configs, target_is_directory=True)
    return work


@pytest.fixture(scope="session")
def mmengine_lenet(mm_work: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """MMEngine's own runs of the released lenet5_mnist.py for 2 epochs, on 1 and 2 processes
    (``mm_reference.run_mmengine``, run once for the session), by number of processes."""
    from mm_reference import run_mmengine

    out = tmp_path_factory.mktemp("mmengine_lenet")
    return {n: run_mmengine("configs/lenet/lenet5_mnist.py", mm_work, out / f"np{n}", ["train_cfg.max_epochs=2"],
                            nproc=n, timeout=300) for n in (1, 2)}
