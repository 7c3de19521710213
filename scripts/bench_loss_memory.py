"""The LM head's loss, its memory: the plain loss's float32 logits for the whole batch against normlab's chunks.

    python scripts/bench_loss_memory.py                      # gpu_125m's shape: 32 x 1024 tokens, d 768, 32,768 rows
    python scripts/bench_loss_memory.py --rows 2048 --vocab 4096 --dim 192

Each way of computing the loss runs in a process of its own, on the CPU, in float32: training's (forward and
backward) as the plain ``F.cross_entropy(hidden @ W.T)`` and as model/loss.py's fused, chunked loss; validation's
(no gradient) as the plain sum over the whole batch's logits and as ``summed_cross_entropy``. Each prints the
peak resident memory it added over the inputs it was given (``ru_maxrss``), and the values, which must agree.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

MEASURE = """
import json, resource, sys
import torch, torch.nn.functional as F
from model.loss import fused_linear_cross_entropy, summed_cross_entropy
rows, dim, vocab, way = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
torch.manual_seed(0)
hidden = torch.randn(rows, dim, requires_grad=way.startswith("train"))
weight = (0.02 * torch.randn(vocab, dim)).requires_grad_(way.startswith("train"))
targets = torch.randint(0, vocab, (rows,))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
if way == "train, plain":
    value = F.cross_entropy(hidden @ weight.t(), targets)
    value.backward()
elif way == "train, fused":
    value = fused_linear_cross_entropy(hidden, weight, targets).objective
    value.backward()
elif way == "validation, plain":
    with torch.no_grad():
        value = F.cross_entropy((hidden @ weight.t()).float(), targets, reduction="sum") / rows
else:
    value = summed_cross_entropy(hidden, weight, targets) / rows
added = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
print(json.dumps({"way": way, "added_bytes": added, "loss": value.item()}))
"""
WAYS = ("train, plain", "train, fused", "validation, plain", "validation, summed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=32 * 1024, help="tokens in the batch (gpu_125m: 32 x 1024)")
    parser.add_argument("--dim", type=int, default=768)
    parser.add_argument("--vocab", type=int, default=32768)
    args = parser.parse_args(argv)
    results = []
    for way in WAYS:
        command = [sys.executable, "-c", MEASURE, str(args.rows), str(args.dim), str(args.vocab), way]
        out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        results.append(json.loads(out.strip().splitlines()[-1]))
    logits = args.rows * args.vocab * 4
    print(
        f"{args.rows:,} tokens, d = {args.dim}, {args.vocab:,} rows: float32 logits of the batch {logits / 2**30:.2f} GiB"
    )
    print(f"{'way':<22} {'peak added':>12} {'loss':>10}")
    for result in results:
        print(f"{result['way']:<22} {result['added_bytes'] / 2**30:>9.2f} GiB {result['loss']:>10.6f}")
    for plain, chunked in ((results[0], results[1]), (results[2], results[3])):
        print(f"{chunked['way']}: {chunked['added_bytes'] / plain['added_bytes']:.3f}x the plain loss's peak")
    return 0


if __name__ == "__main__":
    sys.exit(main())
