"""What each norm choice costs under quantization, against its outlier features and massive activations.

    python train.py -m +experiment=outliers
    python eval.py 'checkpoint=runs/outliers/*' quant=[w8a8,w8a8_tensor,w4a16,fp8]
    python scripts/outliers_report.py runs/outliers --out docs/outliers

What it reads, computes and writes: lab/outliers_report.py.
"""

import argparse
import sys
from pathlib import Path

from lab.outliers_report import write_report
from lab.runs import BASELINE, report_command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inputs", nargs="+", help="the experiment's run folder (runs/outliers), run folders or globs")
    parser.add_argument("--out", type=Path, default=Path("outliers"))
    parser.add_argument("--baseline", default=BASELINE)
    args = parser.parse_args(argv)
    return report_command("outliers_report", lambda: write_report(args.inputs, args.out, args.baseline), args.out)


if __name__ == "__main__":
    sys.exit(main())
