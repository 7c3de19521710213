"""lab/bench_norms.py: the bytes a norm call moves, the basis of its bandwidth, and the two timings."""

import torch

from lab.bench_norms import PASSES, bytes_moved, call_time, kernel_time, time_passes

CPU = torch.device("cpu")


def test_bytes_moved_counts_each_tensor_once():
    # 10 rows of 4 float32 features: a tensor is 160 bytes, the weight 16.
    assert bytes_moved(10, 4, 4) == {"fwd": 2 * 160 + 16, "bwd": 3 * 160 + 32, "fwd+bwd": 5 * 160 + 48}


def test_call_time_runs_the_calls_back_to_back_after_one_warm_up_and_divides_by_them():
    calls = []
    assert call_time(lambda: calls.append(1), CPU, calls=7) > 0 and len(calls) == 8


def test_kernel_time_off_cuda_is_the_median_of_timed_calls_after_warm_up():
    calls = []
    assert kernel_time(lambda: calls.append(1), CPU, reps=5) > 0 and len(calls) == 3 + 5


def test_time_passes_times_forward_and_both_and_takes_the_backward_as_their_difference():
    """The forward records the graph (as training's does), and each timed call starts from x.grad = None."""
    weight = torch.ones(8, requires_grad=True)
    seen = []

    def norm(x):
        seen.append((torch.is_grad_enabled(), x.requires_grad, x.grad))
        return torch.nn.functional.rms_norm(x, (8,), weight)

    x, dy = torch.randn(4, 8), torch.randn(4, 8)
    ticks = iter([2.0, 3.0])  # the timer's answers: the forward, then forward and backward

    def timer(fn, device, count):
        fn()
        return next(ticks)

    seconds = time_passes(norm, x, dy, CPU, timer, 3)
    assert list(seconds) == list(PASSES) and seconds["bwd"] == seconds["fwd+bwd"] - seconds["fwd"] == 1.0
    assert all(entry == (True, True, None) for entry in seen) and len(seen) == 2
