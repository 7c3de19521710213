"""From the data config to tokens: the corpus's splits, the tokenizer, the cached token arrays and the batches."""
