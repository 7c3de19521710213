"""The readers of normlab runs: run directories, statistics, claims and verdicts, figures, reports.

Imported by scripts/, the explorer and the tests; never by norms/, model/ or training/ (data flows one
way, tests/unit/test_import_graph.py). One module per job:

    runs.py            Run: find, load and group run directories; the baseline; report scripts' ending
    keys.py            metric keys by the templates the probes declare
    results.py         a study's runs as results: capped losses, the plan file
    labels.py          variant labels without the switches every variant shares
    stats.py           the verdict engine (paired_comparison), t-tests, Spearman's rho (scipy.stats)
    format.py          the one number and interval formatter
    study.py           a study's statistics per seed: best rate, LR sensitivity, best loss (Study)
    claims.py          claims as data and the one rule that turns them into verdicts
    study_spec.py      a study's spec: configs/study/<name>.yaml
    study_plan.py      the stages of a study: what it trains next
    study_figures.py   a study's figures
    study_report.py    scripts/study_report.py: report.md and study.json
    size_report.py     scripts/size_report.py: LR sensitivity against model size
    outliers_report.py scripts/outliers_report.py: quantization cost against outlier features
    compare_runs.py    scripts/compare_runs.py: plots and a summary of any runs
    bench_norms.py     scripts/bench_norms.py: interleaved timing of every norm implementation
    norm_properties.py invariances, the prefix experiment, costs of every registered norm
    plots.py           matplotlib set-up
"""
