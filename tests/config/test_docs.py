"""docs/config.md and docs/loop.md stay in sync with the schema and the loop."""

from __future__ import annotations

import re
from pathlib import Path

from torch import nn
from torch.utils.data import DataLoader

import treadle
from support import TinyNet, make_data
from treadle.config import DATALOADER_KEYS, SCHEMA
from treadle.config.reference import current_section, main as reference_main, render_reference
from treadle.hooks.base import HOOK_POINTS

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_config_reference_is_generated_from_the_schema():
    text = (DOCS / "config.md").read_text()
    assert current_section(text) == render_reference(), "run: python -m treadle.config.reference --write"
    assert reference_main([]) == 0


def test_config_reference_documents_every_key():
    section = current_section((DOCS / "config.md").read_text())
    for key in [*SCHEMA, *(k.name for k in DATALOADER_KEYS)]:
        assert f"| `{key}` |" in section, key


def test_reference_check_detects_a_stale_page(tmp_path, capsys):
    page = tmp_path / "config.md"
    page.write_text((DOCS / "config.md").read_text().replace("| `seed_per_rank` |", "| `seed_per_ranks` |"))
    assert reference_main(["--path", str(page)]) == 1
    assert reference_main(["--path", str(page), "--write"]) == 0
    assert current_section(page.read_text()) == render_reference()


class _Recorder(treadle.Hook):
    """Records every hook point, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []


for _point in HOOK_POINTS:
    setattr(_Recorder, _point, (lambda name: lambda self, trainer, *a: self.calls.append(name))(_point))


def test_loop_doc_trace_matches_a_real_run(tmp_path):
    text = (DOCS / "loop.md").read_text()
    block = re.search(r"<!-- trace:begin -->\s*```text\n(.*?)```\s*<!-- trace:end -->", text, re.S)
    documented = [line.strip() for line in block.group(1).splitlines() if line.strip()]
    rec = _Recorder()
    # The setup the page describes: 2 epochs of 2 batches, 1 validation batch, a checkpoint per epoch.
    trainer = treadle.Trainer(TinyNet(), work_dir=tmp_path, train_dataloader=DataLoader(make_data(8), batch_size=4),
                              val_dataloader=DataLoader(make_data(4), batch_size=4), loss_fn=nn.CrossEntropyLoss(),
                              optimizer=dict(type="SGD", lr=0.1), max_epochs=2, hooks=[rec],
                              checkpoint=dict(interval=1), log_writers=["jsonl"])
    trainer.fit()
    assert rec.calls == documented


def test_loop_doc_names_every_hook_point():
    text = (DOCS / "loop.md").read_text()
    for point in HOOK_POINTS:
        assert point in text, point


def test_config_page_describes_the_nproc_launch():
    """`treadle train CONFIG --nproc 2` launches two processes (tests/test_cli.py): the page says so."""
    text = (DOCS / "config.md").read_text()
    command_line = text.split("## Command line", 1)[1].split("\n## ", 1)[0]
    sentence = next(s for s in re.split(r"(?<=\.)\s", command_line) if "`--nproc" in s)
    assert "refused" not in sentence and "starts N processes on this machine" in sentence, sentence
