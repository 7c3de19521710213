"""The GPU check's record: the machine and versions it ran on, and its JSON's numbers as Markdown tables."""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import platform
import subprocess

import torch

from lab.bench_norms import PASSES
from lab.gpu_check.stage import ROOT


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def command_output(*command: str) -> str | None:
    """The first line a command prints, or None where it cannot run."""
    try:
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip().splitlines()[0] if result.stdout.strip() else None


def environment(device: torch.device, args: argparse.Namespace, argv: list[str]) -> dict:
    cuda = device.type == "cuda"
    return {
        "device": torch.cuda.get_device_name(device) if cuda else f"CPU ({platform.processor() or platform.machine()})",
        "gpus": torch.cuda.device_count(),
        "driver": command_output("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": package_version("triton"),
        "liger_kernel": package_version("liger-kernel"),
        "transformers": package_version("transformers"),
        "python": platform.python_version(),
        "commit": command_output("git", "describe", "--always", "--dirty"),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "dry_run": args.dry_run,
        "budget_s": args.budget_s,
        "command": " ".join(["python", "scripts/gpu_check.py", *argv]),
    }


def format_value(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def numbers_table(numbers: list[dict]) -> list[str]:
    lines = ["| what | value | unit | against | ratio |", "|---|---|---|---|---|"]
    for n in numbers:
        ratio = "–" if n["ratio"] is None else f"{n['ratio']:.3f}"
        lines.append(f"| {n['name']} | {format_value(n['value'])} | {n['unit']} | {n['baseline']} | {ratio} |")
    return lines


def bandwidth_table(numbers: list[dict]) -> list[str]:
    """The kernel numbers, a row per implementation, shape and timing: GB/s, × its reference, and % of the copy."""
    copies = {(n["kind"], tuple(n["shape"])): n["value"] for n in numbers if n["pass"] == "copy"}
    rows: dict[tuple, list[str]] = {}
    for n in numbers:
        if n["pass"] != "copy":
            cell = f"{format_value(n['value'])} ×{n['ratio']:.2f} ({n['of_copy']:.0%})"
            key = (n["impl"], n["kind"], tuple(n["shape"]), n.get("timing", "kernel"), n["baseline"])
            rows.setdefault(key, []).append(cell)
    lines = [
        "Each pass: GB/s, ×the reference's speed in the same timing, (% of a device copy's bandwidth). Kernel: the",
        "device's time for a call, the L2 flushed before it; call: back-to-back eager calls, host included.",
        "",
        f"| implementation | rows x D | timing | {' | '.join(PASSES)} | reference; copy |",
        "|---|---|---|---|---|---|---|",
    ]
    for (impl, kind, shape, timing, reference), cells in rows.items():
        copy = f"{format_value(copies[kind, shape])} GB/s"
        lines.append(f"| {impl} | {shape[0]}x{shape[1]} | {timing} | {' | '.join(cells)} | {reference}; {copy} |")
    return lines


def markdown(report: dict) -> str:
    meta = report["meta"]
    lines = [
        f"# GPU check: {meta['device']}, {meta['date'][:10]}{' (dry run)' if meta['dry_run'] else ''}",
        "",
        f"`{meta['command']}`: {meta['gpus']} GPU(s), driver {meta['driver'] or '–'}, torch {meta['torch']} "
        f"(CUDA {meta['cuda'] or '–'}), Triton {meta['triton'] or '–'}, Liger {meta['liger_kernel'] or '–'}, "
        f"commit {meta['commit'] or '–'}; a budget of {meta['budget_s']:.0f} s.",
        "",
        "| stage | status | time / share | why |",
        "|---|---|---|---|",
    ]
    for stage in report["stages"]:
        why = (stage.get("error") or stage.get("reason") or "").replace("|", "\\|")  # a table cell
        lines.append(
            f"| {stage['name']} | {stage['status']} | {stage['seconds']:.0f} / {stage['share_s']:.0f} s | {why} |"
        )
    for stage in report["stages"]:
        lines += ["", f"## {stage['name']}", ""]
        lines += [f"- {key}: {value}" for key, value in stage["notes"].items()]
        numbers = stage["numbers"]
        if numbers:
            lines += ["", *(bandwidth_table if "pass" in numbers[0] else numbers_table)(numbers)]
        if stage.get("log_tail"):
            lines += ["", "The failed process's last lines:", "", "```", *stage["log_tail"], "```"]
    return "\n".join(lines) + "\n"


def status_line(record: dict) -> str:
    why = record.get("error") or record.get("reason")
    return f"{record['name']}: {record['status']} in {record['seconds']:.0f} s" + (f": {why}" if why else "")
