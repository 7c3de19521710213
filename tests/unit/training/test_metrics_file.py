"""training/telemetry/metrics_file.py: what a reader makes of a torn or damaged metrics.jsonl."""

import pytest

from training.telemetry.metrics_file import Metrics, MetricsFileError, read_metrics


def test_a_torn_last_metrics_line_is_left_out_and_a_torn_middle_line_refused(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "train/lo')
    assert read_metrics(metrics) == Metrics([{"step": 1}, {"step": 2}], True)
    metrics.write_text('{"step": 1}\n{"step": 2\n{"step": 3}\n')
    with pytest.raises(MetricsFileError, match="line 2 is not JSON"):
        read_metrics(metrics)
    # Training's own checks read what a killed run left: every unreadable line, and rows without a step, skipped.
    metrics.write_text('{"step": 1}\n{"step": 2\n{"note": 1}\n{"step": 3}\n{"step": 4, "tr')
    assert read_metrics(metrics, damaged="skip") == Metrics([{"step": 1}, {"step": 3}], True)
    assert read_metrics(tmp_path / "absent.jsonl") == Metrics([], False)
