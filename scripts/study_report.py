"""A learning-rate study's report: which norm variants train well over which rates, and its claims.

    python train.py -m +experiment=stability
    python scripts/study_report.py runs/stability --out study/ --speed bench_out/variants/results.json

What it computes (LR sensitivity, the claims' intervals and verdicts) and the figures it writes
into --out, next to report.md: analysis/study.py.
"""

import sys

from analysis.study import main

if __name__ == "__main__":
    sys.exit(main())
