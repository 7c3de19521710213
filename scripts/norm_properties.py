"""The analyses behind the norms: invariances, pRMSNorm's prefix, input offsets, costs.

    python scripts/norm_properties.py --out norm_properties/
    python scripts/norm_properties.py --model gpu_125m --out norm_properties/

The experiments are described in lab/norm_properties.py. Writes invariances.png,
prefix.png, offset.png and properties.md into --out.
"""

from lab.norm_properties import main

if __name__ == "__main__":
    main()
