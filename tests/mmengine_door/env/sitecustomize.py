"""A WORKAROUND OF THIS TEST ENVIRONMENT, NOT OF TREADLE (nor of MMEngine or mmpretrain).

``make test-mm`` puts this folder on PYTHONPATH, so every Python process of that run (pytest,
the MMEngine reference runs of ``tests/mmengine_door/mm_reference.py``, their torchrun children
and loader workers) imports this module at start-up (a ``.pth`` file is not read on PYTHONPATH).
It imports nothing heavy itself: it adds two one-shot import hooks.

1. ``torchvision``: PyPI's torchvision 0.28.0 is a CUDA build whose compiled ops do not load
   beside the CPU torch build, and ``import torchvision`` then fails ("operator torchvision::nms
   does not exist"), taking ``mmpretrain.datasets`` with it. Just before torchvision is first
   imported, and only if its ``_C.so`` does not load, ``torchvision::nms``/``qnms`` are defined in
   Python for the CPU (with ``tests/vision/vision_env.py``'s ``nms``). Classification needs no more.
2. ``mmpretrain.datasets.cifar``: CIFAR10/CIFAR100 compare each file's md5 with the real CIFAR
   files' (then try to download them), which the generated files of ``mm_data.py`` cannot pass:
   their md5 entries are set to None once the module has run (the files must still exist).
"""

import importlib.machinery
import os
import sys


_LIBRARIES = []  # the ops live as long as their Library object


def _vision_env():
    """tests/vision/vision_env.py, whose ``nms`` is the stand-in (imported when torchvision is)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "vision"))
    try:
        import vision_env
    finally:
        sys.path.pop(0)
    return vision_env


def _before_torchvision(spec):
    import torch

    try:
        _ = torch.ops.torchvision.nms  # already defined in this process
        return
    except (AttributeError, RuntimeError):
        pass
    try:
        torch.ops.load_library(os.path.join(os.path.dirname(spec.origin), "_C.so"))
        return  # its compiled ops load here: nothing to stand in for
    except OSError:
        pass
    lib = torch.library.Library("torchvision", "DEF")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.impl("nms", _vision_env().nms, "CPU")
    _LIBRARIES.append(lib)


def _after_cifar(module):
    for cls in (module.CIFAR10, module.CIFAR100):
        cls.train_list = [[name, None] for name, _ in cls.train_list]
        cls.test_list = [[name, None] for name, _ in cls.test_list]
        cls.meta = dict(cls.meta, md5=None)


class _Hook:
    """A meta-path finder for one module: ``before(spec)`` runs before it is first imported,
    ``after(module)`` once it has run; then the finder takes itself off ``sys.meta_path``."""

    def __init__(self, name, before=None, after=None):
        self.name, self.before, self.after = name, before, after

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None:
            return None
        if self.before is not None:
            self.before(spec)
        if self.after is not None:
            exec_module, after = spec.loader.exec_module, self.after

            def exec_then_patch(module):
                exec_module(module)
                after(module)

            spec.loader.exec_module = exec_then_patch
        return spec


sys.meta_path[:0] = [_Hook("torchvision", before=_before_torchvision),
                     _Hook("mmpretrain.datasets.cifar", after=_after_cifar)]
