"""Write ``data/mmengine_paramwise.json``: the param groups that MMEngine's
``DefaultOptimWrapperConstructor`` builds for each case of ``tests/paramwise_cases.py``.

Not a test (MMEngine is not a treadle dependency): run it by hand in a scratch venv
that has MMEngine and the same torch, from the repository's root:

    python3 -m venv /tmp/mmvenv && /tmp/mmvenv/bin/pip install torch==<treadle's> mmengine
    PYTHONPATH=tests /tmp/mmvenv/bin/python tests/optim/make_paramwise_reference.py

``tests/optim/test_paramwise.py`` compares treadle's groups with the file.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import mmengine
import torch
from mmengine.logging import MMLogger
from mmengine.optim import DefaultOptimWrapperConstructor

from paramwise_cases import CASES, build, options_by_name

OUT = Path(__file__).resolve().parent / "data" / "mmengine_paramwise.json"


def main() -> None:
    MMLogger.get_instance("mmengine", log_level=logging.ERROR)
    cases = {}
    for case in CASES:
        model, optimizer, paramwise = build(case)
        constructor = DefaultOptimWrapperConstructor({"optimizer": optimizer}, paramwise)
        try:
            opt = constructor(model).optimizer
        except Exception as e:  # e.g. tied weights without bypass_duplicate
            cases[case] = {"error": type(e).__name__, "message": str(e)}
            continue
        cases[case] = {"groups": len(opt.param_groups), "params": options_by_name(model, opt)}
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps({"mmengine": mmengine.__version__, "torch": torch.__version__.split("+")[0],
                               "cases": cases}, indent=1, sort_keys=True) + "\n")
    n = sum(len(c.get("params", {})) for c in cases.values())
    print(f"{OUT}: {len(cases)} cases, {n} parameters (mmengine {mmengine.__version__})")


if __name__ == "__main__":
    main()
