"""The norm explorer: the norms live, your runs, and kernel speed on this machine.

    marimo edit notebooks/explore.py                      # a notebook
    marimo run notebooks/explore.py -- --runs runs/stability   # a read-only web app
    python notebooks/explore.py --runs runs/stability     # every cell, headless

Everything here is computed by normlab's own code: the norms library for the live panels,
the lab package for invariances and the prefix experiment (lab.norm_properties),
for reading runs and the summary table (lab.runs, lab.compare_runs) and for the kernel
benchmark (lab.bench_norms). Metric keys come from the probes' declarations (lab.keys).
"""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium", app_title="normlab explorer")


@app.cell
def _():
    import math
    import time
    from collections import defaultdict
    from pathlib import Path

    import marimo as mo
    import plotly.graph_objects as go
    import torch
    from plotly.colors import qualitative
    from plotly.subplots import make_subplots

    ROOT = mo.notebook_dir().parent

    from lab.bench_norms import IMPLEMENTATIONS, bench_every_norm
    from lab.compare_runs import SUMMARY_NOTE, summary_table
    from lab.keys import metric_key
    from lab.norm_properties import invariance_table, prefix_rms_error, registered_norms
    from lab.runs import (
        SWEPT,
        RunsError,
        check_comparable,
        default_baseline,
        find_run_dirs,
        group_runs,
        load_run,
        loss_ceiling,
    )
    from lab.study_probes import STUDY_PROBES
    from training.telemetry.probes import PROBES, resolve_probe

    LAYER_PANELS = {
        "residual-stream RMS": metric_key("act/layers.{i}/stream_rms"),
        "residual-stream feature kurtosis": metric_key("act/layers.{i}/stream_feature_kurtosis"),
        "largest attention logit": metric_key("attn/layers.{i}/max_logit"),
        "massive-activation ratio": metric_key("act/layers.{i}/massive_ratio"),
        "attention-sink mass": metric_key("attn/layers.{i}/sink_mass"),
    }
    # The train.probes entry that logs each panel: the one whose probe declares its key (a core probe by name).
    PANEL_PROBES = {
        title: next(name for name in (*PROBES, *STUDY_PROBES) if key in resolve_probe(name).keys)
        for title, key in LAYER_PANELS.items()
    }

    ARGS = mo.cli_args()
    return (
        ARGS,
        IMPLEMENTATIONS,
        LAYER_PANELS,
        PANEL_PROBES,
        SWEPT,
        Path,
        ROOT,
        RunsError,
        SUMMARY_NOTE,
        bench_every_norm,
        check_comparable,
        default_baseline,
        defaultdict,
        find_run_dirs,
        go,
        group_runs,
        invariance_table,
        load_run,
        loss_ceiling,
        make_subplots,
        math,
        mo,
        prefix_rms_error,
        qualitative,
        registered_norms,
        summary_table,
        time,
        torch,
    )


@app.cell(hide_code=True)
def _(mo):
    mo.md("""
    # normlab explorer

    1. **The norms, live**: one activation vector through every registered norm, with the invariances
       measured on it and pRMSNorm's prefix experiment.
    2. **Your runs**: curves, per-layer statistics and the summary table of a run or sweep folder.
    3. **Kernel speed on this machine**: the norm benchmark at a size and dtype you choose.
    """)
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md("""
    ## 1. The norms, live

    A random vector, shifted, scaled and given one outlier feature (in red), through every
    registered norm at its initial parameters.
    """)
    return


@app.cell
def _(mo):
    dim_slider = mo.ui.slider(8, 256, step=8, value=64, label="features D", show_value=True)
    shift_slider = mo.ui.slider(-5.0, 5.0, step=0.25, value=1.0, label="mean shift", show_value=True)
    log_scale_slider = mo.ui.slider(-2.0, 2.0, step=0.25, value=0.0, label="scale (log10)", show_value=True)
    outlier_slider = mo.ui.slider(0, 50, step=1, value=10, label="outlier feature (x the RMS)", show_value=True)
    alpha_slider = mo.ui.slider(0.05, 4.0, step=0.05, value=0.5, label="DyT / Derf alpha", show_value=True)
    return (
        alpha_slider,
        dim_slider,
        log_scale_slider,
        outlier_slider,
        shift_slider,
    )


@app.cell
def _(dim_slider, mo):
    k_slider = mo.ui.slider(
        1, dim_slider.value, value=max(1, dim_slider.value // 8), label="pRMSNorm k", show_value=True
    )
    return (k_slider,)


@app.cell
def _(
    alpha_slider,
    dim_slider,
    k_slider,
    log_scale_slider,
    mo,
    outlier_slider,
    shift_slider,
):
    mo.hstack(
        [
            mo.vstack([dim_slider, shift_slider, log_scale_slider]),
            mo.vstack([outlier_slider, k_slider, alpha_slider]),
        ]
    )
    return


@app.cell
def _(
    alpha_slider,
    dim_slider,
    k_slider,
    log_scale_slider,
    outlier_slider,
    registered_norms,
    shift_slider,
    torch,
):
    _generator = torch.Generator().manual_seed(0)
    _base = torch.randn(dim_slider.value, generator=_generator, dtype=torch.float64)
    outlier_index = dim_slider.value // 3
    _base[outlier_index] += outlier_slider.value  # the base vector's RMS is about 1
    activation = 10**log_scale_slider.value * _base + shift_slider.value
    live_options = {
        "prmsnorm": {"k": k_slider.value},
        "dyt": {"alpha_init": alpha_slider.value},
        "derf": {"alpha_init": alpha_slider.value},
    }
    live_norms = registered_norms(dim_slider.value, live_options)
    live_outputs = {name: f(activation) for name, f in live_norms.items()}
    return activation, live_norms, live_outputs, outlier_index


@app.cell
def _(activation, go, live_outputs, make_subplots, math, outlier_index):
    _panels = {"input x": activation, **live_outputs}
    _cols = 4
    _rows = math.ceil(len(_panels) / _cols)
    norms_figure = make_subplots(rows=_rows, cols=_cols, subplot_titles=list(_panels), vertical_spacing=0.12)
    for _i, (_name, _y) in enumerate(_panels.items()):
        _colors = ["crimson" if j == outlier_index else "steelblue" for j in range(len(_y))]
        norms_figure.add_trace(
            go.Bar(y=_y.tolist(), marker_color=_colors, name=_name, showlegend=False),
            row=_i // _cols + 1,
            col=_i % _cols + 1,
        )
    norms_figure.update_layout(height=260 * _rows, margin=dict(t=40, b=20))
    norms_figure
    return


@app.cell
def _(activation, invariance_table, live_norms, live_outputs, mo):
    _table = invariance_table(activation.unsqueeze(0), live_norms, scale=10.0, shift=3.0)
    _rows = [
        {
            "norm": name,
            **{key: f"{value:.2e}" for key, value in deviations.items()},
            "output RMS": f"{live_outputs[name].pow(2).mean().sqrt().item():.3f}",
        }
        for name, deviations in _table.items()
    ]
    mo.vstack(
        [
            mo.md(
                "**Invariances, measured on this vector** (max |f(x') - f(x)|; 0 up to float64 rounding means "
                "invariant). LayerNorm ignores a shift and, with eps scaled by a², a scale; RMSNorm and pRMSNorm "
                "ignore the scale only; DyT and Derf ignore neither (no statistic), and identity nothing."
            ),
            mo.ui.table(_rows, selection=None, pagination=False),
        ]
    )
    return


@app.cell
def _(activation, dim_slider, go, k_slider, mo, prefix_rms_error, torch):
    _generator = torch.Generator().manual_seed(1)
    _dim = dim_slider.value
    _gaussian = torch.randn(256, _dim, generator=_generator, dtype=torch.float64)
    # Outlier channels, as in trained LLMs: per-feature scales that are log-normal and shared by every row.
    _channel_scales = torch.exp(1.5 * torch.randn(_dim, generator=_generator, dtype=torch.float64))
    _inputs = {
        "unstructured (i.i.d. Gaussian)": _gaussian,
        "structured (log-normal channel scales)": _gaussian * _channel_scales,
        "this vector": activation.unsqueeze(0),
    }
    _fractions = [k / _dim for k in range(1, _dim + 1)]
    prefix_figure = go.Figure()
    for _name, _x in _inputs.items():
        prefix_figure.add_trace(go.Scatter(x=_fractions, y=prefix_rms_error(_x), mode="lines", name=_name))
    prefix_figure.add_vline(x=k_slider.value / _dim, line_dash="dot", annotation_text=f"k = {k_slider.value}")
    prefix_figure.update_layout(
        title="pRMSNorm: how well the first k features estimate the RMS",
        xaxis_title="k / D",
        yaxis_title="mean |RMS(x[:k]) / RMS(x) - 1|",
        yaxis_type="log",
        height=380,
    )
    mo.vstack(
        [
            mo.as_html(prefix_figure),
            mo.md(
                "Unstructured features give the sampling error of a random subset; with outlier channels the "
                "prefix misses (or over-weights) the large ones in every row alike, so the error does not average "
                "out over tokens. Zhang & Sennrich used p = 6.25% (k/D = 0.0625); the feature kurtosis that your "
                "runs log (section 2) tells whether your model's activations are the structured kind."
            ),
        ]
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md("""
    ## 2. Your runs
    """)
    return


@app.cell
def _(ARGS, ROOT, mo):
    _default = str(ARGS.get("runs") or "runs")
    runs_text = mo.ui.text(value=_default, label="run or sweep folder", full_width=True)
    _start = ROOT / _default  # an absolute folder stays itself
    runs_browser = mo.ui.file_browser(
        initial_path=_start if _start.exists() else ROOT, selection_mode="directory", multiple=False
    )
    mo.vstack([runs_text, mo.accordion({"or pick a folder": runs_browser})])
    return runs_browser, runs_text


@app.cell
def _(
    Path,
    ROOT,
    RunsError,
    find_run_dirs,
    load_run,
    mo,
    runs_browser,
    runs_text,
    time,
):
    runs_folder = str(runs_browser.path(0)) if runs_browser.value else runs_text.value
    if not Path(runs_folder).exists() and (ROOT / runs_folder).exists():  # relative to the project, not the cwd
        runs_folder = str(ROOT / runs_folder)
    _started = time.perf_counter()
    try:
        _dirs = find_run_dirs([runs_folder])
    except RunsError as _err:
        mo.stop(True, mo.callout(mo.md(f"**No runs to show.** {_err}"), kind="warn"))
    runs, skipped_runs = [], []
    for _path in _dirs:
        try:
            runs.append(load_run(_path))
        except (RunsError, OSError, ValueError, KeyError) as _err:  # damaged metrics, unreadable config
            skipped_runs.append(f"`{_path.name}`: {_err}")
    load_seconds = time.perf_counter() - _started
    mo.stop(
        not runs,
        mo.callout(
            mo.md("**None of these runs can be read.**\n\n" + "\n".join(f"- {s}" for s in skipped_runs)), "danger"
        ),
    )
    return load_seconds, runs, runs_folder, skipped_runs


@app.cell
def _(load_seconds, mo, runs, runs_folder, skipped_runs):
    _notes = [f"- `{r.path.name}`: {r.status()}" for r in runs if r.status() != "finished"]
    _notes += [f"- `{r.path.name}`: its last metrics line was cut off and is left out" for r in runs if r.torn_tail]
    _notes += [f"- skipped {s}" for s in skipped_runs]
    mo.vstack(
        [
            mo.md(f"Loaded **{len(runs)} runs** from `{runs_folder}` in {load_seconds:.2f} s."),
            mo.callout(mo.md("\n".join(_notes)), kind="warn") if _notes else mo.md(""),
        ]
    )
    return


@app.cell
def _(RunsError, SWEPT, mo, runs):
    FILTER_KEYS = ("variant", "norm.name", "norm.placement", "train.lr", "seed", "model.name")

    def config_value(run, key):
        """The key's value as a filter option; "None" for runs made before the key existed."""
        try:
            return str(run.lookup(key))
        except RunsError:
            return "None"

    _choices = {key: sorted({config_value(r, key) for r in runs}) for key in FILTER_KEYS}
    run_filters = mo.ui.dictionary(
        {key: mo.ui.multiselect(options=values, value=values, label=key) for key, values in _choices.items()}
    )
    group_by = mo.ui.dropdown(options=[SWEPT, *FILTER_KEYS], value=SWEPT, label="group by")
    return config_value, group_by, run_filters


@app.cell
def _(
    RunsError,
    check_comparable,
    config_value,
    group_by,
    mo,
    run_filters,
    runs,
):
    selected_runs = [r for r in runs if all(config_value(r, k) in v for k, v in run_filters.value.items())]
    try:
        check_comparable(selected_runs, "val/loss")
        tokenizer_note = None
    except RunsError as _err:
        tokenizer_note = str(_err)
    _metrics = ["val/bpb"] if tokenizer_note else ["train/loss", "val/loss", "val/bpb"]
    metric = mo.ui.dropdown(options=_metrics, value=_metrics[0], label="metric")
    x_axis = mo.ui.radio(options=["step", "tokens", "wall-clock s"], value="step", label="against", inline=True)
    mo.vstack(
        [
            mo.hstack(
                [mo.vstack([run_filters[key] for key in run_filters.value]), mo.vstack([group_by, metric, x_axis])],
                align="start",
            ),
            mo.callout(mo.md(f"**Loss curves are off.** {tokenizer_note}"), kind="warn")
            if tokenizer_note
            else mo.md(""),
            mo.md(f"{len(selected_runs)} of {len(runs)} runs selected."),
        ]
    )
    return metric, selected_runs, tokenizer_note, x_axis


@app.cell
def _(SWEPT, config_value, defaultdict, group_by, group_runs, mo, qualitative, selected_runs):
    mo.stop(not selected_runs, mo.callout(mo.md("No run matches the filters: select more values."), kind="warn"))
    if group_by.value == SWEPT:  # the variant and every other swept key but the seed: seeds alone are pooled
        run_groups = group_runs(selected_runs, SWEPT)
    else:
        run_groups = defaultdict(list)
        for _run in selected_runs:
            run_groups[config_value(_run, group_by.value)].append(_run)
        run_groups = dict(sorted(run_groups.items()))
    group_colors = {name: qualitative.Plotly[i % 10] for i, name in enumerate(run_groups)}
    return group_colors, run_groups


@app.cell
def _(go, group_colors, loss_ceiling, math, metric, run_groups, x_axis):
    def x_values(run, steps):
        if x_axis.value == "tokens":
            return [s * run.config["runtime"]["global_batch_tokens"] for s in steps]
        if x_axis.value == "wall-clock s":
            clock = dict(run.series("perf/elapsed_s"))
            return [clock.get(s) for s in steps]
        return steps

    curves_figure = go.Figure()
    for _group, _runs in run_groups.items():
        for _i, _run in enumerate(_runs):
            _steps, _values = zip(*_run.series(metric.value)) if _run.series(metric.value) else ((), ())
            curves_figure.add_trace(
                go.Scatter(
                    x=x_values(_run, list(_steps)),
                    y=list(_values),
                    mode="lines+markers" if len(_steps) < 30 else "lines",
                    name=_run.path.name,
                    legendgroup=_group,
                    legendgrouptitle_text=_group if _i == 0 else None,
                    line_color=group_colors[_group],
                )
            )
    curves_figure.update_layout(title=f"{metric.value} against {x_axis.value}", height=450, yaxis_type="log")
    curves_figure.update_xaxes(title=x_axis.value)
    _ceiling = (
        loss_ceiling([r for _runs in run_groups.values() for r in _runs]) if metric.value.endswith("loss") else None
    )
    _plotted = [v for _trace in curves_figure.data for v in _trace.y if v > 0]
    if _ceiling is not None and _plotted and max(_plotted) > _ceiling:  # a diverged run leaves the axis
        curves_figure.update_yaxes(range=[math.log10(min(_plotted)), math.log10(_ceiling)])
    curves_figure
    return


@app.cell
def _(LAYER_PANELS, mo, selected_runs):
    _first = next(iter(LAYER_PANELS.values())).format(i=0)
    stats_steps = sorted({row["step"] for run in selected_runs for row in run.rows if _first in row})
    step_slider = (
        mo.ui.slider(
            steps=stats_steps, value=stats_steps[-1], label="statistics at step", full_width=True, show_value=True
        )
        if stats_steps
        else None
    )
    step_slider if step_slider is not None else mo.callout(
        mo.md("These runs log no per-layer statistics (`act/layers.<i>/stream_rms`): train with `train.stats_every`."),
        kind="info",
    )
    return (step_slider,)


@app.cell
def _(LAYER_PANELS, PANEL_PROBES):
    def panel_gap(title, runs_without, selected):
        """One line for a panel that some of the ``selected`` runs did not log: which, and what would log it."""
        # An imported model's one row is its eval.json (it has no metrics until it trains): eval.py runs every probe.
        evaluated = [r for r in runs_without if r.evaluated_only]
        fixes = []
        if len(evaluated) < len(runs_without):
            fixes.append(f"train with `{PANEL_PROBES[title]}` in `train.probes`")
        if evaluated:
            fixes.append("evaluate an imported model with `python eval.py checkpoint=<run>`")
        names = [f"`{r.path.name}`" for r in runs_without]
        if len(runs_without) == len(selected):
            who = "no selected run logged it"
        else:
            who = "not logged by " + ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        return f"**{title}** (`{LAYER_PANELS[title]}`): {who}; {' or '.join(fixes)}."

    return (panel_gap,)


@app.cell
def _(LAYER_PANELS, go, group_colors, make_subplots, mo, panel_gap, run_groups, step_slider):
    mo.stop(step_slider is None)

    _panels = LAYER_PANELS
    _cols = 3  # panels per row
    _rows = -(-len(_panels) // _cols)
    layers_figure = make_subplots(rows=_rows, cols=_cols, subplot_titles=list(_panels))
    for _i, _stat in enumerate(_panels.values()):
        _row, _col = _i // _cols + 1, _i % _cols + 1
        for _group, _runs in run_groups.items():
            for _run in _runs:
                _y = _run.by_layer(_stat, step_slider.value)
                layers_figure.add_trace(
                    go.Scatter(
                        x=list(range(len(_y))),
                        y=_y,
                        name=_run.path.name,
                        legendgroup=_group,
                        showlegend=_i == 0,
                        line_color=group_colors[_group],
                    ),
                    row=_row,
                    col=_col,
                )
    _selected = [r for _runs in run_groups.values() for r in _runs]
    panel_gaps = {}
    for _i, (_title, _stat) in enumerate(_panels.items()):
        _without = [r for r in _selected if not r.by_layer(_stat)]
        if _without:
            panel_gaps[_title] = panel_gap(_title, _without, _selected)
        if len(_without) == len(_selected):  # an empty panel says why, not only its axes
            layers_figure.add_annotation(
                text="not logged: see below",
                xref="x domain",
                yref="y domain",
                x=0.5,
                y=0.5,
                showarrow=False,
                row=_i // _cols + 1,
                col=_i % _cols + 1,
            )
    layers_figure.update_yaxes(type="log")
    layers_figure.update_xaxes(title="layer")
    layers_figure.update_layout(
        height=380 * _rows, title=f"per layer at step {step_slider.value} (the last logged at or before)"
    )
    mo.vstack(
        [
            mo.as_html(layers_figure),
            mo.callout(mo.md("\n".join(f"- {gap}" for gap in panel_gaps.values())), kind="info")
            if panel_gaps
            else mo.md(""),
        ]
    )
    return (panel_gaps,)


@app.cell
def _(go, group_colors, make_subplots, run_groups):
    speed_figure = make_subplots(rows=1, cols=2, subplot_titles=["tokens/s (median over steps)", "peak memory (GB)"])
    for _group, _runs in run_groups.items():
        for _col, _key in enumerate(("perf/tokens_per_sec", "perf/peak_mem_gb"), 1):
            speed_figure.add_trace(
                go.Bar(
                    x=[r.path.name for r in _runs],
                    y=[r.median(_key) for r in _runs],
                    name=_group,
                    marker_color=group_colors[_group],
                    showlegend=_col == 1,
                ),
                row=1,
                col=_col,
            )
    speed_figure.update_layout(height=380, barmode="group")
    speed_figure.update_xaxes(showticklabels=False)
    speed_figure
    return


@app.cell
def _(default_baseline, mo, run_groups, tokenizer_note):
    _metrics = ["val/bpb"] if tokenizer_note else ["val/loss", "val/bpb"]
    summary_metric = mo.ui.dropdown(options=_metrics, value=_metrics[0], label="final metric")
    _groups = list(run_groups)
    baseline = mo.ui.dropdown(options=_groups, value=default_baseline(_groups), label="baseline")
    return baseline, summary_metric


@app.cell
def _(SUMMARY_NOTE, baseline, mo, run_groups, summary_metric, summary_table):
    mo.vstack(
        [
            mo.md("### Summary (as `python -m lab compare` writes it)"),
            mo.hstack([summary_metric, baseline], justify="start"),
            mo.md(summary_table(run_groups, summary_metric.value, baseline.value)),
            mo.md(
                f"{SUMMARY_NOTE} Speed in this table comes from runs that may have shared a machine: for speed "
                "claims use `scripts/bench_variants.py` (interleaved)."
            ),
        ]
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md("""
    ## 3. Kernel speed on this machine
    """)
    return


@app.cell
def _(ARGS, mo, torch):
    _devices = ["cuda", "cpu"] if torch.cuda.is_available() else ["cpu"]
    bench_dim = mo.ui.dropdown(
        options=["512", "2048", "8192", "32768"], value=str(ARGS.get("bench-dim") or 2048), label="hidden size D"
    )
    bench_dtype = mo.ui.dropdown(options=["float32", "bfloat16"], value="float32", label="dtype")
    bench_device = mo.ui.dropdown(options=_devices, value=_devices[0], label="device")
    bench_mb = mo.ui.dropdown(
        options=["1", "16", "64", "256"], value=str(ARGS.get("bench-mb") or 16), label="size of x (MB)"
    )
    bench_compiled = mo.ui.checkbox(label="also torch.compile each norm (a cold compile takes ~30 s per norm)")
    bench_button = mo.ui.run_button(label="run the benchmark")
    mo.vstack(
        [
            mo.hstack([bench_dim, bench_dtype, bench_device, bench_mb], justify="start"),
            bench_compiled,
            bench_button,
        ]
    )
    return (
        bench_button,
        bench_compiled,
        bench_device,
        bench_dim,
        bench_dtype,
        bench_mb,
    )


@app.cell
def _(
    ARGS,
    IMPLEMENTATIONS,
    bench_button,
    bench_compiled,
    bench_device,
    bench_dim,
    bench_dtype,
    bench_mb,
    bench_every_norm,
    mo,
    torch,
):
    mo.stop(
        not (bench_button.value or "bench" in ARGS),
        mo.md("Press **run the benchmark**: every norm, forward and backward, in interleaved rounds (seconds on CPU)."),
    )
    _device = torch.device(bench_device.value)
    _skip = () if bench_compiled.value else tuple(n for n in IMPLEMENTATIONS if n.startswith("compiled_"))
    with mo.status.spinner(title="measuring..."):
        bench_results, bench_skipped = bench_every_norm(
            [int(bench_dim.value)],
            [getattr(torch, bench_dtype.value)],
            _device,
            int(bench_mb.value),
            reps=20 if _device.type == "cuda" else 5,
            rounds=5,
            skip=_skip,
        )
    return bench_results, bench_skipped


@app.cell
def _(bench_results, bench_skipped, go, make_subplots, mo, qualitative):
    _copy = next(r for r in bench_results if r["impl"] == "copy")
    _impls = [r["impl"] for r in bench_results if r["pass"] == "fwd+bwd"]
    bench_figure = make_subplots(rows=1, cols=2, subplot_titles=["time (ms)", "bandwidth / copy bandwidth"])
    for _pass, _color in zip(("fwd", "bwd", "fwd+bwd"), qualitative.Plotly):
        _rows = [r for r in bench_results if r["pass"] == _pass]
        for _col, _key in enumerate(("ms", "frac_of_copy"), 1):
            _shown = [r for r in _rows if _col == 1 or r["impl"] != "identity"]  # identity moves no memory
            bench_figure.add_trace(
                go.Bar(
                    x=[r["impl"] for r in _shown],
                    y=[r[_key] for r in _shown],
                    name=_pass,
                    marker_color=_color,
                    showlegend=_col == 1,
                ),
                row=1,
                col=_col,
            )
    bench_figure.update_layout(
        height=420,
        barmode="group",
        title=f"D = {_copy['dim']}, {_copy['dtype']}, {_copy['rows']} rows; copy: {_copy['gbps']:.1f} GB/s",
    )
    _skipped = "\n".join(f"- {name}: {why}" for name, why in bench_skipped.items())
    mo.vstack([mo.as_html(bench_figure), mo.md(f"Not measured here:\n\n{_skipped}") if _skipped else mo.md("")])
    return


def missing_runs_folder(argv: list[str]) -> str | None:
    """The ``--runs`` folder named on the command line when it does not exist (here or under the project)."""
    from pathlib import Path

    if "--runs" not in argv[:-1]:
        return None
    folder = argv[argv.index("--runs") + 1]
    found = Path(folder).exists() or (Path(__file__).resolve().parents[1] / folder).exists()
    return None if found else folder


if __name__ == "__main__":
    import sys

    if (missing := missing_runs_folder(sys.argv)) is not None:
        print(f"explore: --runs {missing}: no such folder; give a run or sweep folder, e.g. --runs runs/")
        sys.exit(1)
    app.run()
