"""What train.py and eval.py share that is neither model nor norm: one small module per concern."""
