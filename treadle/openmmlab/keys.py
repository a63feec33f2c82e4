"""The top-level names of an MMEngine config, in a module that imports nothing heavy, so
that ``treadle train`` can check a config's key names before torch is imported
(:mod:`treadle.config.early`). :mod:`treadle.openmmlab.translate` translates them."""

from __future__ import annotations

from treadle.components.keys import Key, NoneType

#: MMEngine runtime keys: ``env_cfg``, logging, launcher and test-time augmentation.
RUNTIME_KEYS = ("env_cfg", "log_level", "visualizer", "launcher", "log_processor", "tta_model", "tta_pipeline")

#: Keys that mark a config as MMEngine-style.
MMENGINE_KEYS = ("optim_wrapper", "param_scheduler", "train_cfg", "val_cfg", "test_cfg", "default_hooks",
                 "custom_hooks", "randomness", "model_wrapper_cfg", "find_unused_parameters", *RUNTIME_KEYS)

#: MMEngine keys with no translation, and what to write instead (none today; the config checks
#: name them with this hint).
NOT_TRANSLATED: dict[str, str] = {}

#: Keys of an OpenMMLab project's config that the config layer reads itself (treadle/mmengine/),
#: not Trainer arguments: the registries its type names come from, and its evaluators, which
#: need the built loaders. Absent from a resolved config that does not set them.
PROJECT_KEYS: tuple[Key, ...] = (
    Key("default_scope", (str, NoneType), "a registry scope such as mmpretrain, or null",
        "An OpenMMLab project's registries (MMEngine's `default_scope`): a type name treadle does not know "
        "(`ImageClassifier`, `MNIST`, `Accuracy`) is built by MMEngine's registries of this scope, as its Runner "
        "builds it (`pip install 'treadle[mmengine]'`)."),
    Key("custom_imports", (dict, NoneType), "{imports: [module, ...], allow_failed_imports: false}, or null",
        "Modules imported before anything is built, as MMEngine imports them (they register a project's "
        "classes); refused by `--safe`, which imports nothing a config names."),
    Key("optim_constructor", (dict, NoneType), "{type: a constructor's registry name, paramwise_cfg: {...}}, or null",
        "A project's optimizer wrapper constructor (MMEngine's `optim_wrapper.constructor` of its registry, such as "
        "mmpretrain's `LearningRateDecayOptimWrapperConstructor`): it builds the optimizer's parameter groups over "
        "the model, from `optimizer`; treadle wraps that optimizer (one process or DDP)."),
    Key("val_evaluator", (dict, list, NoneType), "an evaluator spec such as {type: Accuracy, topk: [1]}, a list "
        "of metric specs, or null", "An MMEngine evaluator for validation (its metrics by registry name), run as "
        "MMEngine's ValLoop runs it: results gathered over the data-parallel ranks and named as MMEngine names them "
        "(`accuracy/top1`, logged as `val/accuracy/top1`)."),
    Key("test_evaluator", (dict, list, NoneType), "an evaluator spec, a list of metric specs, or null",
        "The same for `treadle test` (default: none; `metrics` evaluate test passes otherwise)."),
)


__all__ = ["MMENGINE_KEYS", "NOT_TRANSLATED", "PROJECT_KEYS", "RUNTIME_KEYS"]
