# Two commands work on a fresh machine: `make demo` and `make test`.
# Both create .venv when it is missing and install with constraints.txt: `make demo` only what
# the demo needs (torch, treadle and its dependencies, scikit-learn for the digits data), `make
# test` the rest on top (pytest and ruff, the MLflow and W&B writers, DeepSpeed, transformers and
# torchmetrics, the documentation site's packages).
# `make test` also lints (`make lint`, first), runs tests/vision in .venv-vision (`make test-vision`: timm and
# torchvision) and builds the documentation site (`make docs`), warnings as errors. Last it runs `make test-mm`: the
# checks against OpenMMLab's own classes and MMEngine's own Runner, with mmengine, mmcv-lite, mmdet, mmagic,
# mmpretrain and torchvision installed (pinned, without their dependencies) into .venv/openmmlab, apart from .venv.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_STAMP := $(VENV)/.demo-stamp
STAMP := $(VENV)/.installed-stamp

.PHONY: demo lint test test-fast test-vision test-mm docs test-torch test-gpu bench peers-venv peers clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(DEMO_STAMP): $(PY) pyproject.toml constraints.txt
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt torch==2.13.0
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[examples]'
	touch $(DEMO_STAMP)

$(STAMP): $(DEMO_STAMP)
	DS_BUILD_OPS=0 $(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev,trackers,deepspeed,hf,docs,streams]'
	touch $(STAMP)

demo: $(DEMO_STAMP)
	$(PY) -m treadle train examples/digits/digits.yaml --work-dir runs/digits
	@echo "next: .venv/bin/treadle report runs/digits    (summary.md and plots in runs/digits/report; or source .venv/bin/activate, then treadle ...)"

# ruff, configured in pyproject.toml ([tool.ruff]); make test runs it first, so a lint error fails CI.
lint: $(STAMP)
	$(PY) -m ruff check .

# test-vision and test-mm are made from the recipe: their stamps are defined below this rule.
test: lint
	$(PY) -m pytest
	$(MAKE) test-vision
	$(MKDOCS)
	$(MAKE) test-mm

# The checks against OpenMMLab's own classes (mmdet's AspectRatioBatchSampler, mmagic's
# MultiOptimWrapperConstructor with MMEngine's Runner, mmpretrain's PreciseBNHook), which the
# suite skips when they are not importable, and tests/mmengine_door: MMEngine's own Runner on
# released mmpretrain configs (the reference numbers for treadle.mmengine). The projects' packages
# need mmcv's compiled ops, which these tests never import: the wheels go, without their
# dependencies, into a folder of their own (MMDIR), on the path of this run only, with
# tests/mmengine_door/env (MMENV), whose sitecustomize.py stands in torchvision's compiled ops in
# every process of the run (a workaround of the test environment, not of treadle). mmcv-lite,
# torchvision, model-index (the `modelindex` module), ordered-set and mat4py: what
# `import mmpretrain.datasets` needs beyond .venv.
MMDIR := $(VENV)/openmmlab
MMENV := tests/mmengine_door/env
MM_PACKAGES := mmengine==0.10.7 mmdet==3.3.0 mmagic==1.2.0 mmpretrain==1.2.0 mmcv-lite==2.1.0 torchvision==0.28.0 \
	model-index==0.1.11 ordered-set==4.1.0 mat4py==0.6.0 addict==2.4.0 yapf==0.43.0 termcolor==3.3.0 \
	opencv-python-headless==5.0.0.93
MM_TESTS := tests/data/test_grouped.py tests/mmengine_semantics/test_mm_multi_optim.py tests/hooks/test_precise_bn.py \
	tests/mmengine_door

# The stamp holds the list it installed: another list installs again, into an emptied MMDIR (pip
# --target leaves what is already there).
ifneq ($(strip $(file <$(MMDIR)/.stamp)),$(strip $(MM_PACKAGES)))
.PHONY: $(MMDIR)/.stamp
endif

$(MMDIR)/.stamp: $(STAMP)
	rm -rf $(MMDIR)
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --target $(MMDIR) $(MM_PACKAGES)
	echo '$(strip $(MM_PACKAGES))' > $@

test-mm: $(MMDIR)/.stamp
	PYTHONPATH=$(CURDIR)/$(MMDIR):$(CURDIR)/$(MMENV) $(PY) -m pytest $(MM_TESTS)

# timm and torchvision in a venv of their own (the vision extra; torch as in .venv, treadle editable): beside the
# CPU torch build, PyPI's torchvision cannot load its compiled ops, and transformers, which imports torchvision
# once it is installed, would fail in .venv. tests/vision/conftest.py stands in torchvision's nms op in Python
# there (a workaround of the test environment, not of treadle). In .venv those tests skip.
VVENV := .venv-vision
VPY := $(VVENV)/bin/python
VSTAMP := $(VVENV)/.installed-stamp

$(VSTAMP): pyproject.toml constraints.txt
	test -x $(VPY) || $(PYTHON) -m venv $(VVENV)
	$(VPY) -m pip install --quiet --disable-pip-version-check -c constraints.txt torch==2.13.0
	$(VPY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev,vision]'
	$(VPY) -c "import torch, sys; sys.exit(0 if torch.__version__.split('+')[0] == '2.13.0' else 'torch changed: ' + torch.__version__)"
	touch $(VSTAMP)

test-vision: $(VSTAMP)
	$(VPY) -m pytest tests/vision -p no:cacheprovider

# While you work: everything but the multi-process and subprocess tests (marked slow).
test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow"

# Another torch release in a venv of its own, then the fast tier there (make test stays on 2.13):
#   make test-torch TORCH=2.6.0     (PyPI's Linux wheels are CUDA builds of a few GB; they run on the CPU)
# constraints.txt is applied less its pins of torch and of torch's own dependencies (an older torch
# pins e.g. sympy), which pip then resolves for that release.
TORCH ?= 2.6.0
TVENV := .venv-torch-$(TORCH)
TPY := $(TVENV)/bin/python
TSTAMP := $(TVENV)/.installed-stamp

$(TSTAMP): pyproject.toml constraints.txt
	test -x $(TPY) || $(PYTHON) -m venv $(TVENV)
	$(TPY) -m pip install --quiet --disable-pip-version-check torch==$(TORCH)
	$(TPY) tools/constraints_without_torch.py constraints.txt > $(TVENV)/constraints.txt
	DS_BUILD_OPS=0 $(TPY) -m pip install --quiet --disable-pip-version-check -c $(TVENV)/constraints.txt -e '.[dev,trackers,deepspeed,hf]'
	$(TPY) -c "import torch, sys; sys.exit(0 if torch.__version__.split('+')[0] == '$(TORCH)' else 'torch changed: ' + torch.__version__)"
	touch $(TSTAMP)

test-torch: $(TSTAMP)
	$(TPY) -m pytest -m "not slow" -p no:cacheprovider

# On a machine with GPUs: the fast tier on CUDA, tests/gpu, exact resume after SIGKILL on CUDA, the
# benchmarks; a table at the end (tools/gpu_check.py). `DEVICE=cpu` for a dry run without a GPU.
DEVICE ?= cuda
test-gpu: $(STAMP)
	$(PY) tools/gpu_check.py --device $(DEVICE)

# The documentation site (mkdocs.yml) into site/: a broken link or anchor, or a docstring
# whose Args name no parameter, fails the build. It reads the sources; nothing is fetched.
MKDOCS := NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet --site-dir site
docs: $(STAMP)
	$(MKDOCS)

bench: $(STAMP)
	$(PY) benchmarks/overhead.py

# The peers of benchmarks/peers.py and benchmarks/peers_compare.py (Lightning, Accelerate, MMEngine,
# Ignite) in a venv of their own, never treadle's dependencies: torch as in .venv, treadle editable, the
# pins of benchmarks/peers-requirements.txt, all with constraints.txt, so torch stays the pinned CPU build.
#   make peers-venv && .venv-peers/bin/python benchmarks/peers_compare.py --quick
PVENV := .venv-peers
PPY := $(PVENV)/bin/python
PSTAMP := $(PVENV)/.installed-stamp

$(PSTAMP): pyproject.toml constraints.txt benchmarks/peers-requirements.txt
	test -x $(PPY) || $(PYTHON) -m venv $(PVENV)
	$(PPY) -m pip install --quiet --disable-pip-version-check -c constraints.txt torch==2.13.0
	$(PPY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e .
	$(PPY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -r benchmarks/peers-requirements.txt
	$(PPY) -c "import torch, sys; sys.exit(0 if torch.__version__.split('+')[0] == '2.13.0' else 'torch changed: ' + torch.__version__)"
	touch $(PSTAMP)

peers-venv: $(PSTAMP)

peers: $(PSTAMP)
	$(PPY) benchmarks/peers.py

clean:
	rm -rf $(VENV) $(PVENV) $(VVENV) .venv-torch-* runs site
