"""Compare training runs without wandb: plots and a Markdown summary, grouped by norm variant.

    python scripts/compare_runs.py runs/sweep-2026-11-30_10-00-00 --out comparison/
    python scripts/compare_runs.py 'runs/small-*' --group-by model.name --baseline small

Inputs are run directories, folders holding runs (a multirun sweep), or globs. Each run's
config.yaml and metrics.jsonl are read; runs are grouped by a config key (the norm variant,
e.g. ``rmsnorm-peri-qk``, by default) and seeds are pooled: curves show the mean over a group's runs with a band of one
standard deviation. The summary compares each group's final validation metric with the
baseline group's, paired by seed as the studies compare (lab.stats.paired_comparison; Welch's
unpaired test where seeds do not pair, named as such).

Writes loss.png, throughput.png, activations.png, gains.png, depth.png, summary.md and summary.json
(the table's numbers, unrounded) into --out.
"""

import sys

from lab.compare_runs import main

if __name__ == "__main__":
    sys.exit(main())
