"""Shared test setup.

TRITON_INTERPRET must be set before any @triton.jit function is defined, so it is set here,
at import time, before the tests import ``norms``: on a machine without a GPU the fused
kernels then run in Triton's interpreter on CPU tensors. With a GPU they are compiled.
"""

import os

if os.environ.get("PYTEST_XDIST_WORKER"):
    # A worker of `pytest -n`: one thread for it and for every process its tests start. Processes whose
    # threads together outnumber the cores spin while they wait for each other (training/run/cpu_threads.py).
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (marked gpu)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:  # the marker, not a test id that happens to read "gpu"
            item.add_marker(skip)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    """One tokenizer and token cache for every test that trains (read-only once built)."""
    return str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="session")
def sweep(tmp_path_factory, cache_dir):
    """Two norms x two seeds of tiny runs made by train.py, laid out like a multirun sweep (read-only)."""
    from tiny_runs import run_tiny

    root = tmp_path_factory.mktemp("sweep")
    for norm in ("rmsnorm", "layernorm"):
        for seed in (0, 1):
            run_tiny(root / f"{norm}-s{seed}", cache_dir, 4, f"norm={norm}", f"seed={seed}")
    return root
