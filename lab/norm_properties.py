"""The analyses behind the norms: invariances, pRMSNorm's prefix, input offsets, costs.

    python -m lab norm-properties --out norm_properties/
    python -m lab norm-properties --model gpu_125m --out norm_properties/

Computed with normlab's own ``norms`` functions, in float64 where exactness is the point:
1. invariances: scale (exact when eps scales by a^2), shift, mean-centering; max deviations.
2. the prefix experiment: two rows of eight features, one with a balanced prefix and one
   with a low-energy prefix and a larger suffix; pRMSNorm's deviation from RMSNorm for
   k = 1..8 (zero at k = 8, not necessarily monotone in between).
3. the offset experiment: output mean and RMS against a constant offset c added to the input.
4. costs for a model config: parameters per norm and in the model, aten ops dispatched per
   eager call (each elementwise or reduction op is a pass over memory), and measured
   forward and forward+backward time on this machine.

Writes invariances.png, prefix.png, offset.png and properties.md into --out.
"""

from __future__ import annotations

import argparse
import functools
import inspect
from collections.abc import Callable
from pathlib import Path

import torch
import yaml
from torch.utils._python_dispatch import TorchDispatchMode

from lab.bench_norms import measure
from lab.plots import pyplot, save
from model import ModelConfig, NormConfig, Transformer
from norms import NORM_NAMES, build_norm, norm_class, norm_options, partial_rms_norm, rms_norm

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def registered_norms(dim: int, options: dict[str, dict] | None = None) -> dict[str, Callable]:
    """name -> f(x, eps=None) for every registered norm at its initial parameters (gains of one:
    the gain does not change these properties), in float64; eps is passed to norms that take one.
    ``options`` are per-norm constructor options, e.g. ``{"prmsnorm": {"k": 8}, "dyt": {"alpha_init": 2.0}}``."""

    def op(name):
        def f(x, eps=None):
            kwargs = dict((options or {}).get(name, {}))
            if eps is not None and "eps" in norm_options(name):
                kwargs["eps"] = eps
            with torch.no_grad():
                return build_norm(name, dim, **kwargs).double()(x)

        return f

    return {name: op(name) for name in NORM_NAMES}


def _default_eps(name: str) -> float:
    parameter = inspect.signature(norm_class(name).__init__).parameters.get("eps")
    return parameter.default if parameter is not None else 1.0


def invariances(dim: int = 64, rows: int = 256, scale: float = 10.0, shift: float = 3.0) -> dict[str, dict]:
    torch.manual_seed(0)
    x = torch.randn(rows, dim, dtype=torch.float64)
    return invariance_table(x, registered_norms(dim), scale, shift)


def invariance_table(x: torch.Tensor, ops: dict[str, Callable], scale: float, shift: float) -> dict[str, dict]:
    """Per norm, the max deviation of its output under scaling and shifting x (float64; see ``registered_norms``)."""
    table = {}
    for name, f in ops.items():
        eps = _default_eps(name)
        table[name] = {
            f"scale x{scale:g}, fixed eps": (f(scale * x) - f(x)).abs().max().item(),
            f"scale x{scale:g}, eps x{scale**2:g}": (f(scale * x, eps * scale**2) - f(x, eps)).abs().max().item(),
            f"shift +{shift:g}": (f(x + shift) - f(x)).abs().max().item(),
            "max abs row mean of output": f(x).mean(dim=-1).abs().max().item(),
        }
    return table


PREFIX_ROWS = {
    "balanced prefix": torch.tensor([1.0, -0.8, 1.2, -1.1, 0.9, -1.0, 1.05, -0.95], dtype=torch.float64),
    "low-energy prefix": torch.tensor([0.1, -0.2, 0.15, 0.3, 2.0, -3.0, 2.5, -1.5], dtype=torch.float64),
}


def prefix_experiment() -> dict[str, list[float]]:
    """max |pRMSNorm_k(x) - RMSNorm(x)| for k = 1..8, per row."""
    return {
        name: [(partial_rms_norm(row, None, k) - rms_norm(row)).abs().max().item() for k in range(1, 9)]
        for name, row in PREFIX_ROWS.items()
    }


def prefix_rms_error(x: torch.Tensor) -> list[float]:
    """For k = 1..D, how far the RMS of the first k features is from the RMS of all D:
    the mean over rows of |RMS(x[:k]) / RMS(x) - 1|, read off pRMSNorm's and RMSNorm's outputs
    (each output's norm is sqrt(D) over the RMS it divided by)."""
    x = x.double()
    full = torch.linalg.vector_norm(rms_norm(x, eps=1e-300), dim=-1)
    errors = []
    for k in range(1, x.shape[-1] + 1):
        partial = torch.linalg.vector_norm(partial_rms_norm(x, None, k, eps=1e-300), dim=-1)
        errors.append((full / partial - 1).abs().mean().item())
    return errors


def offset_experiment(dim: int = 64, rows: int = 256) -> tuple[list[float], dict[str, dict[str, list[float]]]]:
    torch.manual_seed(0)
    x = torch.randn(rows, dim, dtype=torch.float64)
    offsets = [c / 2 for c in range(-20, 21)]
    curves = {}
    for name, f in registered_norms(dim).items():
        outputs = [f(x + c) for c in offsets]
        curves[name] = {
            "mean": [y.mean().item() for y in outputs],
            "rms": [y.pow(2).mean().sqrt().item() for y in outputs],
        }
    return offsets, curves


class _OpCounter(TorchDispatchMode):
    """Counts the aten ops an eager call dispatches."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def _forward_backward(norm: torch.nn.Module, x: torch.Tensor, dy: torch.Tensor) -> None:
    norm(x).backward(dy)


def costs(model_name: str, rows: int) -> list[dict]:
    """Per norm: parameters, eager aten ops per call, and measured time at the model's width.

    Parameters in the model count the norm instances that the model builds (pre-norm placement).
    """
    preset = yaml.safe_load((CONFIGS / "model" / f"{model_name}.yaml").read_text())
    preset.pop("name")
    dim = preset["d_model"]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    results = []
    for name in NORM_NAMES:
        norm = build_norm(name, dim).to(device)
        if norm.backend(device) == "triton-interpreter":
            continue  # its timing would be Python's, not the kernel's
        x = torch.randn(rows, dim, device=device, requires_grad=True)
        dy = torch.randn(rows, dim, device=device)
        counter = _OpCounter()
        with counter:
            y = norm(x)
        forward_ops = counter.count
        counter = _OpCounter()
        with counter:
            y.backward(dy)
        params = sum(p.numel() for p in norm.parameters())
        with torch.device("meta"):
            model = Transformer(ModelConfig(**preset, norm=NormConfig(name=name)))
        in_model = sum(p.numel() for module in model.norm_modules().values() for p in module.parameters())
        results.append(
            {
                "norm": name,
                "params per norm": params,
                "params in model": in_model,
                "eager ops fwd": forward_ops,
                "eager ops bwd": counter.count,
                "fwd ms": 1000 * measure(functools.partial(norm, x), device),
                "fwd+bwd ms": 1000 * measure(functools.partial(_forward_backward, norm, x, dy), device),
            }
        )
    return results


def table(rows: list[dict]) -> str:
    columns = list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = [f"{v:.3g}" if isinstance(v, float) else str(v) for v in row.values()]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_invariances(inv: dict[str, dict], path: Path) -> None:
    plt = pyplot()
    properties = list(next(iter(inv.values())))
    fig, ax = plt.subplots(figsize=(10, 4))
    width = 0.8 / len(inv)
    for i, (name, values) in enumerate(inv.items()):
        ax.bar(
            [j + i * width for j in range(len(properties))],
            [max(values[p], 1e-17) for p in properties],
            width,
            label=name,
        )
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(properties))], properties, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("max deviation (float64; 1e-17 = exact)")
    ax.legend()
    save(fig, path)


def plot_prefix(prefix: dict[str, list[float]], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, row in PREFIX_ROWS.items():
        axes[0].bar([i + (0.4 if "low" in name else 0) for i in range(8)], row.tolist(), 0.4, label=name)
        axes[1].plot(range(1, 9), prefix[name], marker="o", label=name)
    axes[0].set_title("the two rows (features 1..8)")
    axes[1].set_title("max |pRMSNorm_k - RMSNorm|")
    axes[1].set_xlabel("k (prefix features in the statistic)")
    for ax in axes:
        ax.legend()
        ax.grid(alpha=0.3)
    save(fig, path)


def plot_offset(offsets: list[float], curves: dict, path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, curve in curves.items():
        axes[0].plot(offsets, curve["mean"], label=name)
        axes[1].plot(offsets, curve["rms"], label=name)
    axes[0].set_title("output mean")
    axes[1].set_title("output RMS")
    for ax in axes:
        ax.set_xlabel("offset c added to every input feature")
        ax.legend()
        ax.grid(alpha=0.3)
    save(fig, path)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("norm_properties"))
    parser.add_argument("--model", default="small", help="model preset for the cost table (configs/model)")
    parser.add_argument("--rows", type=int, default=2048, help="tokens per timed call")


def run(args: argparse.Namespace) -> int:
    args.out.mkdir(parents=True, exist_ok=True)

    inv = invariances()
    prefix = prefix_experiment()
    offsets, curves = offset_experiment()
    cost = costs(args.model, args.rows)
    plot_invariances(inv, args.out / "invariances.png")
    plot_prefix(prefix, args.out / "prefix.png")
    plot_offset(offsets, curves, args.out / "offset.png")

    inv_rows = [{"norm": name, **values} for name, values in inv.items()]
    prefix_rows = [{"row": name, **{f"k={k}": v for k, v in enumerate(values, 1)}} for name, values in prefix.items()]
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    report = f"""# Norm properties

## Invariances (max deviation, float64, 256 rows of 64 features)
{table(inv_rows)}

## pRMSNorm prefix experiment (max |pRMSNorm_k - RMSNorm|, rows of 8 features)
{table(prefix_rows)}

## Offset experiment
Adding c to every input feature: LayerNorm's output is unchanged (mean 0, RMS 1); RMSNorm's
output mean tends to ±1 and its RMS stays 1. See offset.png.

## Costs at d_model of model={args.model}, {args.rows} tokens per call, on {device}
{table(cost)}
"""
    (args.out / "properties.md").write_text(report)
    print(report)
    print(f"wrote {args.out}")
    return 0
