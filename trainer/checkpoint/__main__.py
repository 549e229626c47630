"""python -m trainer.checkpoint --checkpoint runs/<id>/checkpoints/step-<n>: write its consolidated weights."""
from __future__ import annotations

import argparse
import sys

from trainer.checkpoint.consolidated import consolidate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.checkpoint", description=__doc__.split(":")[0])
    parser.add_argument("--checkpoint", required=True, help="a checkpoints/step-<n> folder")
    print(consolidate(parser.parse_args(argv).checkpoint))
    return 0


if __name__ == "__main__":
    sys.exit(main())
