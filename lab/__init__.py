"""The readers of normlab runs: run directories, statistics, claims and verdicts, figures, reports.

Imported by scripts/, the explorer and the tests; never by norms/, model/ or training/ (data flows one
way, tests/unit/test_import_graph.py). Its commands are behind one door, ``python -m lab <command>``
(__main__.py). One module per job:

    runs.py            Run: find, load and group run directories; the baseline; how a report command ends
    keys.py            metric keys by the templates the probes declare
    results.py         a study's runs as results: capped losses, the plan file
    labels.py          run labels without the switches every arm of a study shares
    stats.py           the verdict engine (paired_comparison), t-tests, Spearman's rho (scipy.stats)
    format.py          the one number and interval formatter; the files every report writes
    study.py           a study's statistics per seed: best rate, LR sensitivity, best loss (Study)
    claims.py          claims as data and the one rule that turns them into verdicts
    study_spec.py      a study's spec: configs/study/<name>.yaml
    study_plan.py      the stages of a study: what it trains next
    study_figures.py   a study's figures
    run_study.py       study: train a study to the end, then write its report
    study_report.py    report: one model's study, report.md and study.json
    across_models.py   across-models: a study at several models (depths, widths), against their axis
    regrade.py         regrade: a committed study.json's claims judged again, under Holm's correction
    outliers_report.py outliers: quantization cost against outlier features
    dyt_map.py         dyt-map: the settings at which DyT (and Derf) start to train
    compare_runs.py    compare: plots and a summary of any runs
    bench_norms.py     bench-norms: interleaved timing of every norm implementation
    norm_properties.py norm-properties: invariances, the prefix experiment, costs of every registered norm
    plots.py           matplotlib set-up
    unigram.py         the unigram loss, the line a study's "trained" reads
    study_probes/      the studies' probes (massive activations, sinks, layer importance, norm time, nGPT)
    step_timing.py     training steps of several models timed in interleaved rounds (the speed benchmarks)
    gpu_check/         scripts/gpu_check.py's stages: correctness, kernels, profile, training, compiled, distributed
"""
