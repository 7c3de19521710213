"""Analyses of normlab runs: the one reader of run directories and metrics.jsonl, statistics,
plots, run comparisons and study reports. Importable by scripts/, the explorer and training.

    metrics.py         read_metrics: metrics.jsonl, the only parser of it
    keys.py            metric keys by the templates the probes declare
    runs.py            Run, find and load run directories, group them, the baseline
    stats.py           Welch's and paired t-tests, bootstrap intervals
    plots.py           matplotlib set-up
    compare.py         scripts/compare_runs.py: plots and a summary of any runs
    study.py           scripts/study_report.py: a learning-rate study and its claims
    claims.py          claims declared as data in an experiment config, evaluated
    norm_properties.py invariances, the prefix experiment, costs of every registered norm
    kernel_bench.py    interleaved timing of every norm implementation
"""
