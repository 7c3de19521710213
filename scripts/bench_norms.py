"""Forward, backward and forward+backward speed of every norm implementation on this machine.

    python scripts/bench_norms.py                          # CPU or GPU, defaults per device
    python scripts/bench_norms.py --dims 1024 4096 --dtypes bfloat16 --out bench_out/norms

Each result is a time and an effective bandwidth: bytes moved / time, counting x, y, dy, dx and
the weight once each (forward: x, y; backward: x, dy, dx; plus the weight and its gradient).
A plain device copy (read x, write y) measured in the same run is the bandwidth ceiling, and
every result is also printed as a fraction of it: for forward+backward, the fraction of the
memory-bound floor of five tensor passes at copy bandwidth. Implementations are measured in
interleaved rounds (the order rotating), and each number is the median over rounds. Rows are sized so each tensor is far larger
than the caches. Every registered norm is timed as the model runs it (eager, and under
``torch.compile``), next to torch's own norms; a norm whose backend here is the Triton
interpreter (it would time Python, not the kernel) and Liger (needs CUDA and liger-kernel) are
listed as skipped, with the reason. Each runs on the backend the model would use (its
``backend(device)``: the C kernel for RMSNorm on CPU, torch's kernel for LayerNorm, ...).
``identity`` moves no memory: its time is the call overhead.

Output: a table on stdout, results.json and bandwidth.png in --out.
"""

from analysis.kernel_bench import main

if __name__ == "__main__":
    main()
