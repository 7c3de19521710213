"""What a run measures and where it goes: validation, probes, throughput, metrics.jsonl and wandb."""
