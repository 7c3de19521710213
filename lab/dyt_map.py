"""Where DyT (and Derf) start to train: the map that configs/experiment/dyt_map.yaml trains.

    python train.py -m +experiment=dyt_map                   # and the experiment's other commands
    python -m lab dyt-map runs/dyt_map --out docs/study/dyt

A *setting* is a norm, a model (its width), the norms' alpha, the embedding scale and the schedule
(rate and warmup); the map runs one seed of each, seed 0, which chooses the best setting; a setting's
command with ``seed=1,2,3`` adds the seeds that report it. DyT's best setting is compared with no norm
(``norm=identity``) only once each has run at least MIN_RATES rates on seed 0, which picks each one's
rate, and then on seeds that chose neither the setting nor the rates. A run *trains* when its final validation loss is at least TRAINED_MARGIN (0.3) nats below
the unigram loss of the validation windows, the studies' line (lab/study.py). A setting with one
seed is read from that seed; with several it trains when every seed does, and its mean loss gets a
Student's t interval.

It writes into --out ``map.png`` (each setting's loss against alpha, relative to the unigram loss,
one panel per norm and width), ``map.json`` and ``report.md``, which name per norm the smallest model
at which some setting trains and the settings that do.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

from lab.format import interval, number, write_report_files
from lab.keys import fields
from lab.plots import pyplot, save
from lab.results import VAL_LOSS
from lab.runs import Run, RunsError, load_runs, show_report
from lab.stats import paired_by_seed, t_interval
from lab.study import SATURATED, TRAINED_MARGIN
from lab.unigram import run_unigram_loss
from training.checkpoints.files import list_checkpoints
from training.checkpoints.sharded import read_checkpoint

COMMAND = "python train.py -m +experiment=dyt_map"


@dataclass(frozen=True)
class Setting:
    """What one cell of the map sets; its runs differ only in their seed."""

    norm: str
    model: str
    d_model: int
    params: int
    alpha: float | None  # None for a norm without one: `identity`, the map's no-norm control
    embed_scale: str
    lr: float
    warmup_steps: int
    steps: int
    batch_size: int

    @property
    def schedule(self) -> str:
        return f"lr {self.lr:g}, warmup {self.warmup_steps}, {self.steps} steps of {self.batch_size} sequences"


def setting_of(run: Run) -> Setting:
    cfg = run.config
    return Setting(
        cfg["norm"]["name"],
        cfg["model"]["name"],
        int(cfg["model"]["d_model"]),
        int(cfg["runtime"]["params"]),
        None if cfg["norm"].get("alpha_init") is None else float(cfg["norm"]["alpha_init"]),
        str(cfg["model"]["embed_scale"]),
        float(cfg["train"]["lr"]),
        int(cfg["train"]["warmup_steps"]),
        int(cfg["train"]["max_steps"]),
        int(cfg["train"]["batch_size"]),
    )


def final_loss(run: Run) -> float | None:
    """The final validation loss; None for a run that diverged (it did not train)."""
    return None if run.diverged_at is not None else run.last(VAL_LOSS)


def saturation(run: Run) -> list[float]:
    """Each norm's share of inputs in tanh's (erf's) flat part, |alpha x| > 2, at the last stats step."""
    for row in reversed(run.rows):
        values = [value for key, value in row.items() if fields(SATURATED, key) is not None]
        if values:
            return values
    return []


def final_alphas(run: Run) -> list[float]:
    """Each norm's alpha in the run's last checkpoint: where training left it (the map sweeps where it starts)."""
    checkpoints = list_checkpoints(run.path)
    if not checkpoints:
        return []
    state = read_checkpoint(checkpoints[-1])[1]["model"]  # whole or sharded
    return [float(value) for key, value in state.items() if key.endswith(".alpha")]


# The seed that maps every setting and chooses the best setting and rates; the others report them.
MAP_SEED = 0
# A rate counts as tuned over at least this many rates (the studies' minimum for a curve), the best strictly
# inside them.
MIN_RATES = 3


def at_other_rates(setting: dict, settings: list[dict]) -> list[dict]:
    """The settings that differ from ``setting`` at most in their rate (``setting`` among them)."""
    keys = [k for k in Setting.__dataclass_fields__ if k not in ("lr", "params")]
    return [s for s in settings if all(s[k] == setting[k] for k in keys)]


def map_rates(candidates: list[dict]) -> list[float]:
    """The rates the map's seed ran, of one setting at several rates."""
    return sorted({s["lr"] for s in candidates if MAP_SEED in s["seeds"]})


def tuned_rate(candidates: list[dict]) -> tuple[dict | None, str | None]:
    """Of one setting at several rates, the rate with the lowest loss on the map's seed (which chooses it),
    or None and why: the map's seed ran fewer than MIN_RATES rates, diverged at every one, or did best at an
    edge of them."""
    ran = [s for s in candidates if MAP_SEED in s["seeds"]]
    rates = map_rates(ran)
    if len(rates) < MIN_RATES:
        return None, f"{len(rates)} rate(s) run on seed {MAP_SEED}, fewer than the {MIN_RATES} a tuned rate needs"
    finished = [s for s in ran if s["map_loss"] is not None]
    if not finished:
        return None, f"seed {MAP_SEED} diverged at every rate ({rates[0]:g} to {rates[-1]:g})"
    chosen = min(finished, key=lambda s: s["map_loss"])
    if chosen["lr"] in (rates[0], rates[-1]):
        return None, f"best rate {chosen['lr']:g} at an edge of the rates run ({rates[0]:g} to {rates[-1]:g})"
    return chosen, None


def report_losses(setting: dict) -> dict[int, float]:
    """A setting's final loss on each seed but the map's, which chose it: the seeds that report it."""
    return {
        seed: loss for seed, loss in zip(setting["seeds"], setting["losses"]) if seed != MAP_SEED and loss is not None
    }


def against_no_norm(best: dict, settings: list[dict]) -> dict:
    """The best setting against the no-norm control (no alpha, the same model, embedding scale and warmup),
    each at its own best rate, both chosen on the map's seed over at least MIN_RATES rates; the difference
    paired over the seeds that did not choose them (two or more). Else the reason it is not compared."""
    family = at_other_rates(best, settings)
    dyt, why = tuned_rate(family)
    if dyt is None:
        return {"reason": f"{best['norm']}'s rate is not tuned: {why}"}
    control_family = at_other_rates({**best, "norm": "identity", "alpha": None}, settings)
    control, why = tuned_rate(control_family)
    if control is None:
        return {"reason": f"the no-norm control's rate is not tuned: {why}"}
    mine, theirs = report_losses(dyt), report_losses(control)
    seeds, comparison = paired_by_seed(mine, theirs, "higher") or ([], None)
    if len(seeds) < 2:
        return {"reason": f"{len(seeds)} seed(s) that did not choose the rates ran both; two or more compare"}
    return {
        "control": control["norm"],
        "rates": map_rates(family),
        "control_rates": map_rates(control_family),
        "lr": dyt["lr"],
        "control_lr": control["lr"],
        "seeds": seeds,
        "values": [mine[s] for s in seeds],
        "values_control": [theirs[s] for s in seeds],
        "difference": comparison.difference,
        "ci95": comparison.ci95,
        "p": comparison.p,
    }


def summarize(runs: list[Run]) -> dict:
    """Every setting's seeds, losses and verdict, and per norm the smallest model at which one trains."""
    by_setting: dict[Setting, list[Run]] = defaultdict(list)
    for run in runs:
        by_setting[setting_of(run)].append(run)
    unigrams = {run_unigram_loss(run, compute=True) for run in runs}
    if len(unigrams) != 1 or None in unigrams:
        raise RunsError(
            "the runs do not share one unigram loss (lab/unigram.py): they validate on different "
            f"windows, or their data cannot be built here ({sorted(map(str, unigrams))}); map one corpus at a time"
        )
    unigram = unigrams.pop()
    line = unigram - TRAINED_MARGIN
    settings = []
    for setting, seed_runs in by_setting.items():
        seed_runs.sort(key=lambda r: r.config["seed"])
        losses = [final_loss(r) for r in seed_runs]
        finite = [loss for loss in losses if loss is not None]
        saturated = [shares for r in seed_runs if (shares := saturation(r))]
        alphas = final_alphas(seed_runs[0])
        settings.append(
            {
                **asdict(setting),
                "seeds": [r.config["seed"] for r in seed_runs],
                "losses": losses,
                # the map's own seed, which chooses the best setting (None where it diverged or did not run)
                "map_loss": next((loss for r, loss in zip(seed_runs, losses) if r.config["seed"] == MAP_SEED), None),
                "loss": {"mean": statistics.fmean(finite), "ci95": t_interval(finite)} if finite else None,
                "trained": all(loss is not None and loss <= line for loss in losses),
                # over the norms, mean over seeds: the mean share, and the most saturated norm's
                "saturated": statistics.fmean(statistics.fmean(s) for s in saturated) if saturated else None,
                "saturated_max": statistics.fmean(max(s) for s in saturated) if saturated else None,
                "alpha_end": [min(alphas), max(alphas)] if alphas else None,  # over the norms, the map seed's run
            }
        )
    size = {s["model"]: _params(settings, s["model"]) for s in settings}  # (a list being sorted reads as empty)
    settings.sort(
        key=lambda s: (s["norm"], size[s["model"]], s["embed_scale"], -s["lr"], s["warmup_steps"], s["alpha"] or 0.0)
    )
    smallest = {}
    for norm in sorted({s["norm"] for s in settings}):
        # settings the map's seed ran (a setting with only added seeds is not on the map)
        trained = [s for s in settings if s["norm"] == norm and s["trained"] and s["map_loss"] is not None]
        if trained:
            mine = [s for s in settings if s["norm"] == norm]
            model = min({s["model"] for s in trained}, key=lambda m: _params(mine, m))
            at_smallest = [s for s in trained if s["model"] == model]
            best = min(at_smallest, key=lambda s: s["map_loss"])  # chosen on the map's seed
            reported = report_losses(best)  # so the seeds that report it never chose it
            smallest[norm] = {
                "model": model,
                "params": _params(mine, model),
                "best": best,
                "settings": len(at_smallest),
                "report": {
                    "seeds": list(reported),
                    "mean": statistics.fmean(reported.values()),
                    "ci95": t_interval(list(reported.values())),
                }
                if reported
                else None,  # fmt: skip
                "vs_no_norm": None if best["alpha"] is None else against_no_norm(best, settings),  # the control itself
            }
        else:
            smallest[norm] = None
    return {"unigram_loss": unigram, "line": line, "trained_margin": TRAINED_MARGIN, "settings": settings,
            "smallest_trained": smallest}  # fmt: skip


def plot_map(summary: dict, path: Path) -> None:
    """A panel per norm with an alpha and model, a line per embedding scale and schedule (one colour each
    across panels); a norm without an alpha (the no-norm control) is a dotted level in its model's panels."""
    plt = pyplot()
    with_alpha = [s for s in summary["settings"] if s["alpha"] is not None]
    panels = sorted({(s["norm"], s["model"]) for s in with_alpha}, key=lambda p: (p[0], _params(with_alpha, p[1])))
    # a line per schedule that the map swept alpha at; the rate-tuning runs of one alpha are in the table
    points = defaultdict(set)
    for s in with_alpha:
        points[(s["embed_scale"], s["lr"], s["warmup_steps"])].add(s["alpha"])
    curves = sorted(curve for curve, alphas in points.items() if len(alphas) > 1)
    colours = {curve: f"C{i}" for i, curve in enumerate(curves)}
    schedules = {(lr, warmup) for _, lr, warmup in curves}
    controls = [
        s
        for s in summary["settings"]
        if s["alpha"] is None and s["map_loss"] is not None and (s["lr"], s["warmup_steps"]) in schedules
    ]
    columns = min(2, len(panels))
    rows = -(-len(panels) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(6.5 * columns, 4.2 * rows), squeeze=False, sharey=True)
    for ax, (norm, model) in zip(axes.flat, panels):
        for curve in curves:
            cells = sorted(
                (s for s in with_alpha if (s["norm"], s["model"]) == (norm, model)
                 and (s["embed_scale"], s["lr"], s["warmup_steps"]) == curve),
                key=lambda s: s["alpha"],
            )  # fmt: skip
            if cells:
                # the map's seed, which every setting ran (a mean over added seeds would not compare)
                losses = [summary["unigram_loss"] if s["map_loss"] is None else s["map_loss"] for s in cells]
                ax.plot(
                    [s["alpha"] for s in cells],
                    [loss - summary["unigram_loss"] for loss in losses],
                    marker="o",
                    color=colours[curve],
                    label=f"embed {curve[0]}, lr {curve[1]:g}, warmup {curve[2]}",
                )
        for i, s in enumerate(c for c in controls if c["model"] == model):
            ax.axhline(
                s["map_loss"] - summary["unigram_loss"],
                ls=":",
                color="black" if i == 0 else "grey",
                label=f"{s['norm']} (no norm), embed {s['embed_scale']}",
            )
        ax.axhline(0.0, color="grey", lw=0.8)
        ax.axhline(-summary["trained_margin"], color="grey", lw=0.8, ls="--")
        ax.set_xscale("log")
        ax.set_xlabel("alpha (every norm's initial value)")
        ax.set_ylabel("final val loss − unigram loss (nats)")
        ax.set_title(f"{norm}, {model}")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.suptitle(
        f"The map's seed 0; below the dashed line ({summary['trained_margin']} nats under the unigram loss) a run trains"
    )
    save(fig, path)


def _params(settings: list[dict], model: str) -> int:
    """A model's size: its fewest parameters over the settings (a learned embedding scale adds one)."""
    return min(s["params"] for s in settings if s["model"] == model)


def _row(s: dict) -> str:
    loss = s["loss"]
    value = "diverged" if loss is None else number(loss["mean"], ".3f") + interval(loss["ci95"])
    seeds = ", ".join(number(x, ".3f") for x in s["losses"]) if len(s["losses"]) > 1 else ""
    end = "–" if s["alpha_end"] is None else " to ".join(f"{a:.2g}" for a in s["alpha_end"])
    return (
        f"| {s['norm']} | {s['model']} ({s['params'] / 1e6:.2f}M) | {number(s['alpha'], 'g')} | {end} | "
        f"{s['embed_scale']} | {s['lr']:g} | {s['warmup_steps']} | {s['steps']} × {s['batch_size']} | "
        f"{len(s['seeds'])} | {value}{f' ({seeds})' if seeds else ''} | {number(s['saturated'], '.0%')}, "
        f"{number(s['saturated_max'], '.0%')} | {'yes' if s['trained'] else 'no'} |"
    )


def findings(summary: dict) -> list[str]:
    """Per norm: the smallest model at which a setting trains, and which alphas train at each model."""
    lines = []
    for norm, found in summary["smallest_trained"].items():
        mine = [s for s in summary["settings"] if s["norm"] == norm]
        if found is None:
            lines.append(
                f"{norm}: none of its {len(mine)} settings trains (none ends {summary['trained_margin']} nats below the unigram loss)."
            )
            continue
        best, report = found["best"], found["report"]
        confirmed = (
            f"on seeds {', '.join(map(str, report['seeds']))}, which did not choose it, its mean is "
            f"{report['mean']:.3f}{interval(report['ci95'])}"
            if report and len(report["seeds"]) >= 2
            else "not confirmed: fewer than two seeds that did not choose it ran it (its command with seed=1,2 adds them)"
        )
        versus = found["vs_no_norm"]  # None for the control itself
        if versus is not None and "reason" in versus:
            confirmed += f"; not compared with no norm: {versus['reason']}"
        elif versus is not None:
            confirmed += (
                f"; against no norm ({versus['control']}, the same model, embedding scale and warmup), each at its "
                f"best rate on the map's seed ({versus['lr']:g} of {', '.join(f'{r:g}' for r in versus['rates'])}; "
                f"{versus['control_lr']:g} of {', '.join(f'{r:g}' for r in versus['control_rates'])}), it is "
                f"{versus['difference']:+.3f}{interval(versus['ci95'], '+.3f')} nats, p = {number(versus['p'])}, "
                f"paired over seeds {', '.join(map(str, versus['seeds']))}"
            )
        lines.append(
            f"{norm} trains from {found['model']} ({found['params'] / 1e6:.2f}M parameters), the smallest model "
            f"mapped at which a setting trains: {found['settings']} settings there. The best on the map's seed "
            f"{best['seeds'][0]} is alpha {number(best['alpha'], 'g')}, embed {best['embed_scale']}, "
            f"{Setting(**{k: best[k] for k in Setting.__dataclass_fields__}).schedule}, at {best['map_loss']:.3f}; "
            f"{confirmed}."
        )
        for model in sorted({s["model"] for s in mine}, key=lambda m: _params(mine, m)):
            alphas = sorted({number(s["alpha"], "g") for s in mine if s["model"] == model and s["trained"]})
            lines.append(
                f"{norm} at {model}: trains at alpha {', '.join(alphas)} (in some setting)"
                if alphas
                else f"{norm} at {model}: trains at no alpha mapped"
            )  # fmt: skip
    return lines


def write_report(inputs: list[str], out: Path) -> Path:
    runs, skipped = load_runs(inputs)
    finished = []
    for run in runs:
        if run.unfinished:
            skipped.append(f"{run.path}: {run.status()}; rerun its command to finish it")
        else:
            finished.append(run)
    if not finished:
        raise RunsError(f"no finished run under {', '.join(inputs)}; train the map first: {COMMAND}")
    summary = summarize(finished)
    out.mkdir(parents=True, exist_ok=True)
    plot_map(summary, out / "map.png")
    table = [
        "| norm | model | alpha | alpha at the end | embed scale | lr | warmup | steps × batch | seeds "
        "| final val loss [95% CI] (per seed) | saturated: mean, most | trains |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        *(_row(s) for s in summary["settings"]),
    ]
    report = f"""# Where DyT starts to train: the map

{len(finished)} runs, {len(summary["settings"])} settings (configs/experiment/dyt_map.yaml). A setting trains when
its final validation loss is at least {summary["trained_margin"]} nats below the unigram loss
{summary["unigram_loss"]:.3f} (the line {summary["line"]:.3f}), every seed of it. Saturated: the share of
the norms' inputs with |alpha x| > 2, where tanh (erf) is flat, at the end of training: the mean over the
model's norms and the most saturated norm's (means over seeds). Alpha at the end: the lowest and highest
over the model's norms in the last checkpoint of the map's seed (alpha is learned; the map sets its start).

![final loss against alpha](map.png)

## What the map shows

{chr(10).join("- " + line for line in findings(summary))}

## Every setting

{chr(10).join(table)}
"""
    return write_report_files(out, report, skipped, "map.json", summary)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="+", help="the map's run folder (runs/dyt_map), run folders or globs")
    parser.add_argument("--out", type=Path, default=Path("dyt_map"))


def run(args: argparse.Namespace) -> int:
    return show_report("dyt-map", lambda: write_report(args.inputs, args.out), args.out)
