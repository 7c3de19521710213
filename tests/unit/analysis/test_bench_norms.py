"""analysis/bench_norms.py: the bytes a norm call moves, the basis of its bandwidth."""

from analysis.bench_norms import bytes_moved


def test_bytes_moved_counts_each_tensor_once():
    # 10 rows of 4 float32 features: a tensor is 160 bytes, the weight 16.
    assert bytes_moved(10, 4, 4) == {"fwd": 2 * 160 + 16, "bwd": 3 * 160 + 32, "fwd+bwd": 5 * 160 + 48}
