"""Where DyT (and Derf) start to train: the report on configs/experiment/dyt_map.yaml's runs.

    python train.py -m +experiment=dyt_map                                        # and the experiment's other commands
    python scripts/dyt_map_report.py runs/dyt_map --out docs/study/dyt

What it reads, computes and writes: lab/dyt_map.py.
"""

import argparse
import sys
from pathlib import Path

from lab.dyt_map import write_report
from lab.runs import report_command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inputs", nargs="+", help="the map's run folder (runs/dyt_map), run folders or globs")
    parser.add_argument("--out", type=Path, default=Path("dyt_map"))
    args = parser.parse_args(argv)
    return report_command("dyt_map_report", lambda: write_report(args.inputs, args.out), args.out)


if __name__ == "__main__":
    sys.exit(main())
