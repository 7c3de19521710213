"""The lab's one command line: ``python -m lab <command> ...`` for every study and report.

    python -m lab study +experiment=stability --out docs/study      # train a study to the end, then report
    python -m lab report runs/stability --out docs/study            # the report again, from the runs
    python -m lab --help                                            # every command; <command> --help: its flags

Each command is a module of the lab with ``add_arguments(parser)`` and ``run(args) -> exit status``; only the
chosen command's module is imported. ``study`` passes the arguments it does not know to Hydra.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# command -> (module, what it does)
COMMANDS = {
    "study": ("lab.run_study", "train a study to the end, stage by stage, and write its report"),
    "report": ("lab.study_report", "a learning-rate study's report: its arms across rates, and its claims"),
    "across-models": ("lab.across_models", "a study at several models (depths, widths): its claims at each"),
    "regrade": ("lab.regrade", "judge a committed study.json's claims again, under Holm's correction"),
    "compare": ("lab.compare_runs", "compare any runs: plots and a summary against a baseline"),
    "dyt-map": ("lab.dyt_map", "where DyT (and Derf) start to train: the map's report"),
    "outliers": ("lab.outliers_report", "each norm's cost under quantization against its outlier features"),
    "norm-properties": ("lab.norm_properties", "the norms' invariances, pRMSNorm's prefix, input offsets, costs"),
    "bench-norms": ("lab.bench_norms", "forward and backward speed of every norm implementation here"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="python -m lab", description="The lab's studies and reports, one command each."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="<command>")
    modules = {}
    for name, (module, summary) in COMMANDS.items():
        sub = commands.add_parser(name, help=summary, description=summary)
        if name in argv[:1]:  # the chosen command's flags; the others are only listed
            modules[name] = importlib.import_module(module)
            modules[name].add_arguments(sub)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        if "overrides" not in args:  # only a command that passes its arguments on declares them
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        args.overrides = unknown
    return modules[args.command].run(args)


if __name__ == "__main__":
    sys.exit(main())
