"""The depth study's report: each placement and depth fix at 4, 8 and 16 layers, and the depth papers' claims.

    python scripts/run_study.py +experiment=stability_depth
    python scripts/depth_report.py runs/stability_depth --out docs/study/depth

What it computes and writes: lab/depth_report.py.
"""

import sys

from lab.depth_report import main

if __name__ == "__main__":
    sys.exit(main())
