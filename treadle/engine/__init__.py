"""The engine: the Trainer and the rooms it runs through.

    trainer.py    the Trainer: holds the components, runs the entry points
    spec.py       its arguments, each defined once (TrainerArgs: type, default, doc, checks)
    argspec.py    what is derived from such a definition: signature, docstring, checks, config keys
    args.py       the arguments, checked, turned into components
    loops.py      the training flow: epochs, iterations, workflow phases
    eval_loop.py  validation and test passes
    step.py       the default train and eval steps
    snapshot.py   what a Trainer checkpoint holds, by owner
    run_dir.py    the run directory: its lock, run files, checkpoint names
    resume.py     finding the checkpoint to resume from
    preemption.py signals: save at the next iteration boundary and exit

Hooks (treadle/hooks/) see the run through ``treadle.hooks.view.RunView`` and never
import from here.
"""

from typing import Any

from treadle.lazy import import_submodule


def __getattr__(name: str) -> Any:
    """A submodule on first use (``treadle.engine.<module>`` after a bare ``import treadle``)."""
    return import_submodule(__name__, name)
