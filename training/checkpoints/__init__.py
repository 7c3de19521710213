"""Checkpoints: whole ones as files, sharded ones as directories, read as data only."""
