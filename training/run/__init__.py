"""A run: its config turned into the model, data and optimizer it trains, its record, lock and resume."""
