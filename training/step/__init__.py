"""What a training step does beyond the model: the optimizer, the hooks after it, non-finite losses, processes."""
