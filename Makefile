# Two commands work on a fresh machine: `make demo` and `make test`.
# Both create .venv when it is missing and install with constraints.txt.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test test-fast bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml constraints.txt
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt torch==2.13.0
	DS_BUILD_OPS=0 $(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev,trackers,deepspeed]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m treadle train examples/digits/digits.yaml --work-dir runs/digits

test: $(STAMP)
	$(PY) -m pytest

# While you work: everything but the multi-process and subprocess tests (marked slow).
test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow"

bench: $(STAMP)
	$(PY) benchmarks/overhead.py

clean:
	rm -rf $(VENV) runs
