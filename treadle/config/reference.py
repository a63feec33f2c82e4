"""The key reference of ``docs/config.md``, generated from the schema.

    python -m treadle.config.reference            # check docs/config.md is up to date
    python -m treadle.config.reference --write    # regenerate its reference section

Only the text between the BEGIN/END markers is generated; the rest of the page is
written by hand. A test fails when the committed page differs from the schema.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from treadle.components.registry import DATASETS, HOOKS, METRICS, MODELS, SAMPLERS
from treadle.config.schema import DATALOADER_KEYS, PROJECT_KEYS, TRAINER_KEYS, Key, trainer_defaults

BEGIN = "<!-- BEGIN GENERATED: python -m treadle.config.reference --write -->"
END = "<!-- END GENERATED -->"
DOC_PATH = Path(__file__).resolve().parents[2] / "docs" / "config.md"


def _inline(value: Any) -> str:
    """A default as it is written in YAML, on one line."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(keys: tuple[Key, ...], defaults: dict[str, Any] | None) -> list[str]:
    head = "| key | type | default | meaning |" if defaults is not None else "| key | type | meaning |"
    lines = [head, "| --- | --- | --- | --- |" if defaults is not None else "| --- | --- | --- |"]
    for k in keys:
        cells = [f"`{k.name}`", _cell(k.expected)]
        if defaults is not None:
            cells.append("required" if k.name == "model" else f"`{_cell(_inline(defaults[k.name]))}`")
        cells.append(_cell(k.doc))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def render_reference() -> str:
    """The generated section, markers included."""
    defaults = trainer_defaults()
    names = lambda reg: ", ".join(f"`{n}`" for n in reg)  # noqa: E731
    lines = [BEGIN, "", "### Trainer keys", "", *_table(TRAINER_KEYS, defaults), "",
             "### Dataloader keys", "", "`train_dataloader`, `val_dataloader` and `test_dataloader` take these "
             "(everything but `dataset` goes to `torch.utils.data.DataLoader`).", "",
             *_table(DATALOADER_KEYS, None), "",
             "### OpenMMLab project keys", "",
             "Keys of an MMEngine-style config that the config layer reads (docs/mmengine.md); absent unless set.", "",
             *_table(PROJECT_KEYS, None), "",
             "### Registered names", "",
             f"* models (`model.type`): {names(MODELS)}",
             f"* datasets (`dataset.type`): {names(DATASETS)}",
             f"* hooks (`hooks[i].type`): {names(HOOKS)}",
             f"* metrics (`metrics.<name>.type`, `train_metrics.<name>.type`): {names(METRICS)}",
             f"* samplers (`*_dataloader.sampler.type`): {names(SAMPLERS)}",
             "* losses (`loss_fn.type`): every loss class of `torch.nn` (`CrossEntropyLoss`, `MSELoss`, ...)",
             "* optimizers (`optimizer.type`): every class of `torch.optim` (`SGD`, `AdamW`, ...)",
             "* schedulers (`schedulers[i].type`): `treadle.optim.scheduler_builder.SCHEDULERS`",
             "", END]
    return "\n".join(lines)


def current_section(text: str) -> str | None:
    """The generated section of a page's text, or None without markers."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < 0:
        return None
    return text[start:end + len(END)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the section in place")
    parser.add_argument("--path", type=Path, default=DOC_PATH)
    args = parser.parse_args(argv)
    text = args.path.read_text(encoding="utf-8")
    old, new = current_section(text), render_reference()
    if old is None:
        print(f"{args.path}: no {BEGIN} ... {END} markers", file=sys.stderr)
        return 1
    if old == new:
        return 0
    if args.write:
        args.path.write_text(text.replace(old, new), encoding="utf-8")
        return 0
    print(f"{args.path} is out of date: run python -m treadle.config.reference --write", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
