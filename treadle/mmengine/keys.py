"""The top-level names of an MMEngine config, in a module that imports nothing heavy, so
that ``treadle train`` can check a config's key names before torch is imported
(:mod:`treadle.config.early`). :mod:`treadle.mmengine.translate` translates them."""

from __future__ import annotations

#: MMEngine runtime keys: ``env_cfg``, logging, launcher and test-time augmentation.
RUNTIME_KEYS = ("env_cfg", "log_level", "visualizer", "launcher", "log_processor", "tta_model", "tta_pipeline")

#: Keys that mark a config as MMEngine-style.
MMENGINE_KEYS = ("optim_wrapper", "param_scheduler", "train_cfg", "val_cfg", "test_cfg", "default_hooks",
                 "custom_hooks", "randomness", "default_scope", *RUNTIME_KEYS)

#: MMEngine keys with no translation, and what to write instead.
NOT_TRANSLATED = {
    "val_evaluator": "MMEngine evaluators are not translated; use metrics: {name: {type: ...}} (update/compute/reset)",
    "test_evaluator": "MMEngine evaluators are not translated; use metrics: {name: {type: ...}}",
    # MMEngine imports these modules while reading the config; treadle never imports for a key.
    "custom_imports": "treadle imports no modules for a config; name classes by dotted type paths (trusted configs) "
                      "or register them from Python (treadle.components.registry) and remove custom_imports",
}

__all__ = ["MMENGINE_KEYS", "NOT_TRANSLATED", "RUNTIME_KEYS"]
