"""The analyses behind the norms: invariances, pRMSNorm's prefix, input offsets, costs.

    python scripts/norm_properties.py --out norm_properties/
    python scripts/norm_properties.py --model gpu_125m --out norm_properties/

Computed with normlab's own ``norms`` functions, in float64 where exactness is the point:
1. invariances: scale (exact when eps scales by a^2), shift, mean-centering; max deviations.
2. the prefix experiment: two rows of eight features, one with a balanced prefix and one
   with a low-energy prefix and a larger suffix; pRMSNorm's deviation from RMSNorm for
   k = 1..8 (zero at k = 8, not necessarily monotone in between).
3. the offset experiment: output mean and RMS against a constant offset c added to the input.
4. costs for a model config: parameters per norm and in the model, aten ops dispatched per
   eager call (each elementwise or reduction op is a pass over memory), and measured
   forward and forward+backward time on this machine.

Writes invariances.png, prefix.png, offset.png and properties.md into --out.
"""

from analysis.norm_properties import main

if __name__ == "__main__":
    main()
