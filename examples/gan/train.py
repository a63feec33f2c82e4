"""Train the ring GAN from its config and report how many modes it covers.

    python examples/gan/train.py [--set max_iters=500]

The run of gan.yaml, with its time and result (its header says them).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from treadle.config import build_trainer, load_config, save_config

CONFIG = Path(__file__).with_name("gan.yaml")


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", default="runs/gan-py")  # not the config's runs/gan
    parser.add_argument("--set", nargs="+", default=[], dest="overrides", metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    cfg = load_config(CONFIG, args.overrides, mode="train", work_dir=args.work_dir)
    trainer = build_trainer(cfg)
    save_config(cfg, Path(args.work_dir) / "config.yaml")
    trainer.fit()
    coverage = trainer.module.mode_coverage()
    print(f"modes covered: {coverage:.0%}")
    return coverage


if __name__ == "__main__":
    main()
