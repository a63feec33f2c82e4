"""tests/vision: timm and torchvision, in the venv ``make test-vision`` builds (.venv-vision; in
.venv, without them, these tests skip). torchvision's compiled ops do not load beside the CPU
torch build: vision_env.py (a workaround of this test environment, not of treadle) stands in
for them before any test imports torchvision or timm."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vision_env import load_torchvision

load_torchvision()
