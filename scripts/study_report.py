"""A learning-rate study's report: which norm variants train well over which rates, and its claims.

    python scripts/run_study.py +experiment=stability      # trains the study, then writes this report
    python scripts/study_report.py runs/stability --out study/ --speed bench_out/variants/results.json

What it computes (LR sensitivity, the claims' intervals and verdicts) and the figures it writes
into --out, next to report.md: lab/study_report.py. Several model sizes: scripts/size_report.py
(``--size`` here still runs it).
"""

import sys

from lab import size_report, study_report

if __name__ == "__main__":
    if "--size" in sys.argv:  # the earlier spelling of scripts/size_report.py
        sys.exit(size_report.main([a for a in sys.argv[1:] if a != "--size"]))
    sys.exit(study_report.main())
