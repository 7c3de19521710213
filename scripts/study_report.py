"""The stability study's report: which norm variants train well over which learning rates, and why.

    python train.py -m +experiment=stability
    python scripts/study_report.py runs/stability --out study/ --speed bench_out/variants/results.json

In the style of Wortsman et al. 2023 ("Small-scale proxies for large-scale Transformer training
instabilities") and Peri-LN (Kim et al. 2025). Reads every run under the inputs (runs missing
metrics are named and skipped) and writes into --out:

- loss_vs_lr.png: final validation loss and bits per byte against learning rate, one curve per
  variant, diverged runs marked at the initial loss;
- report.md: per variant the best learning rate and loss (mean ± std over seeds, Welch's p
  against the baseline from two seeds up), the LR sensitivity, divergences, the speed table when
  --speed names a scripts/bench_variants.py result, and conclusions drawn from these numbers;
- attention_logits.png: the largest attention logit against step, at the highest learning rate
  the baseline survives and the next one up;
- stream_rms_depth.png: the residual stream's RMS against depth at the end of training;
- feature_kurtosis.png: the outlier-feature kurtosis of the residual stream over training.

LR sensitivity (Wortsman et al., Sec. 3.1): the mean over the learning-rate grid of
``min(final loss, initial loss) - best loss``, where a diverged run counts as the initial loss
and the initial loss is that of the untrained model, ln(vocabulary size).
"""

import sys

from analysis.study import main

if __name__ == "__main__":
    sys.exit(main())
