"""`import treadle` stays light: optional packages are imported by the feature that uses them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each test imports treadle in a fresh interpreter

ROOT = Path(__file__).resolve().parent.parent

# Each is needed by one feature only (TensorBoard writer, report plots, progress bar,
# config files, safetensors export, trackers, the DeepSpeed strategy, a model spec's peft: key).
LAZY = ("tensorboard", "torch.utils.tensorboard", "matplotlib", "rich", "yaml", "safetensors", "mlflow", "wandb",
        "deepspeed", "peft")


def _modules_after(code: str) -> list[str]:
    probe = f"import sys\n{code}\nimport json\nprint(json.dumps([m for m in {LAZY!r} if m in sys.modules]))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_treadle_imports_no_optional_package():
    assert _modules_after("import treadle") == []
    # Resolving the DeepSpeed strategy checks its options; deepspeed is imported by its setup().
    assert _modules_after("import treadle; treadle.strategies.build.resolve_strategy('deepspeed')") == []


def test_building_a_trainer_without_a_work_dir_imports_no_optional_package():
    code = ("import torch, treadle\n"
            "treadle.Trainer(torch.nn.Linear(2, 2), train_dataloader=[(torch.randn(4, 2), torch.zeros(4, dtype=torch.long))],\n"
            "                loss_fn=torch.nn.CrossEntropyLoss(), optimizer=dict(type='SGD', lr=0.1), max_iters=1, "
            "progress=False)")
    assert _modules_after(code) == []


def test_progress_bar_hook_is_still_reachable_from_treadle_hooks():
    assert _modules_after("import treadle\nfrom treadle.hooks import ProgressBarHook") == ["rich"]


def test_a_run_with_a_work_dir_writes_tensorboard_events_without_importing_tensorboard_or_protobuf(tmp_path):
    """The events are encoded by treadle.logging.events: importing protobuf's classes cost
    a first fit() about 20 ms. The file is still there and readable."""
    code = ("import torch, treadle\n"
            f"treadle.Trainer(torch.nn.Linear(2, 2), work_dir={str(tmp_path)!r}, progress=False,\n"
            "                train_dataloader=[(torch.randn(4, 2), torch.zeros(4, dtype=torch.long))] * 3,\n"
            "                loss_fn=torch.nn.CrossEntropyLoss(), optimizer=dict(type='SGD', lr=0.1), max_iters=3,\n"
            "                log_interval=1).fit()\n"
            "import sys\n"
            "assert not [m for m in sys.modules\n"
            "            if m.startswith(('tensorboard', 'google.protobuf'))], sys.modules")
    assert _modules_after(code) == []
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(tmp_path / "tensorboard"))
    ea.Reload()
    assert [e.step for e in ea.Scalars("train/loss")] == [1, 2, 3]


def test_every_hook_type_a_config_names_is_importable_from_treadle_hooks():
    """docs/config.md lists the hook types of the registry: each is ``from treadle.hooks import``-able
    as the same class (SyncBuffersHook once was not)."""
    import treadle.hooks
    from treadle.components.registry import HOOKS

    for name, cls in HOOKS.items():
        assert getattr(treadle.hooks, name) is cls, name
    assert set(HOOKS) <= set(treadle.hooks.__all__)


def _documented_names() -> list[str]:
    """Every dotted name ``treadle.x.y`` the documentation writes: the API reference's
    ``::: name`` entries and the names in the other pages' text and examples."""
    import re

    names = set()
    for page in (ROOT / "docs").rglob("*.md"):
        for match in re.finditer(r"(?<![\w./-])treadle(?:\.[A-Za-z_]\w*)+", page.read_text()):
            names.add(match.group(0))
    return sorted(names - {"treadle.__main__"})  # a program (python -m treadle), not an attribute


@pytest.mark.parametrize("order", ["forward", "backward"])
def test_every_dotted_name_the_documentation_writes_resolves_after_a_bare_import(order):
    """Each name resolves attribute by attribute after ``import treadle`` alone, whatever
    was resolved before it (both orders; the modules load on first use)."""
    names = _documented_names()
    assert "treadle.seeding.seed_everything" in names and "treadle.checkpoint.sharded.consolidate" in names
    names = names if order == "forward" else names[::-1]
    probe = ("import json, sys, treadle\nbad = []\nfor name in sys.argv[1:]:\n    obj = treadle\n    try:\n"
             "        for part in name.split('.')[1:]:\n            obj = getattr(obj, part)\n"
             "    except AttributeError as e:\n        bad.append(f'{name}: {e}')\nprint(json.dumps(bad))")
    out = subprocess.run([sys.executable, "-c", probe, *names], capture_output=True, text=True, check=True, cwd=ROOT)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_the_seeding_example_of_the_docs_runs_after_a_bare_import():
    code = "import treadle, torch\ntreadle.seeding.seed_everything(0)\nprint(torch.initial_seed())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == "0", out.stderr[-2000:]


def test_the_voice_of_a_failing_job_needs_no_torch():
    """A configuration error found before torch is imported is said once for the job
    (treadle/distributed/voice.py) without importing it."""
    code = ("import sys\nimport treadle.distributed.voice as voice\nfrom treadle.distributed import DistEnv\n"
            "assert voice.fail('treadle train: config error: x', 'config') == 2\nprint('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr[-2000:]
    assert out.stderr.strip() == "treadle train: config error: x"
