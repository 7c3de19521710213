"""LR sensitivity against model size, with and without QK-norm: a study run at several widths.

    python scripts/run_study.py +experiment=stability_size
    python scripts/size_report.py runs/stability --out docs/study/size

What it computes and writes: lab/size_report.py.
"""

import sys

from lab.size_report import main

if __name__ == "__main__":
    sys.exit(main())
