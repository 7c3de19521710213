"""Forward, backward and forward+backward speed of every norm implementation on this machine.

    python scripts/bench_norms.py                          # CPU or GPU, defaults per device
    python scripts/bench_norms.py --dims 1024 4096 --dtypes bfloat16 --out bench_out/norms

What is measured and how (interleaved rounds, bandwidth against a copy): lab/bench_norms.py.
Output: a table on stdout, results.json and bandwidth.png in --out.
"""

from lab.bench_norms import main

if __name__ == "__main__":
    main()
