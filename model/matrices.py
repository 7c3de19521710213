"""The logical matrices of a module's weights: a fused weight (q|k|v, gate|up) once per matrix it stacks.

Whatever treats a weight matrix as a matrix, rather than as numbers, needs its logical pieces: an
initialization whose scale depends on a matrix's shape (Xavier-normal), or an optimizer that orthogonalizes
each matrix. The modules that fuse weights say how through ``fused_rows``.
"""

from __future__ import annotations

from torch import nn


def logical_matrices(module: nn.Module) -> list[tuple[str, nn.Parameter, slice]]:
    """Every 2-D parameter under ``module`` as (name, parameter, its rows), a fused weight once per
    logical matrix, named ``attn.qkv_proj.weight[q]``, in row order."""
    fused = {
        f"{module_name}.{param_name}".lstrip("."): blocks
        for module_name, child in module.named_modules()
        if hasattr(child, "fused_rows")
        for param_name, blocks in child.fused_rows().items()
    }
    matrices = []
    for name, param in module.named_parameters():
        if param.dim() != 2:
            continue
        if name not in fused:
            matrices.append((name, param, slice(None)))
            continue
        start = 0
        for part, rows in fused[name]:
            matrices.append((f"{name}[{part}]", param, slice(start, start + rows)))
            start += rows
        if start != param.shape[0]:
            raise ValueError(f"{name}: its logical matrices cover {start} of its {param.shape[0]} rows")
    return matrices
