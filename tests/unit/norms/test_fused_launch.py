"""norms/fused/launch.py: the launch table's rules hold for every row length, and the one-wave grid's arithmetic."""

import pytest

from norms.fused import launch
from norms.fused.launch import H100_SXM, programs_per_sm, row_settings

DIMS = [*range(1, 2049), *range(2049, 3 * 16384, 61), 16384, 8192, 32768]


@pytest.mark.parametrize("element_size", [2, 4])
def test_every_row_length_gets_a_block_that_holds_it_or_a_loop(element_size):
    for dim in DIMS:
        settings = row_settings(dim, element_size)
        fwd, bwd = settings.forward, settings.backward
        block = 1 << (dim - 1).bit_length()
        assert settings.single_block == (block * element_size <= launch.SINGLE_BLOCK_BYTES), dim
        if not settings.single_block:
            assert fwd.kind == bwd.kind == "looping" and fwd.block == launch.LOOPING_BLOCK
            continue
        assert fwd.block == bwd.block == block and fwd.kind == "tile"
        for shape, cap in ((fwd, launch.MAX_WARPS["fwd"]), (bwd, max(launch.MAX_WARPS["bwd"], launch.WIDE_WARPS))):
            assert shape.warps & (shape.warps - 1) == 0 and 1 <= shape.warps <= cap, (dim, shape)
        assert fwd.rows * block == max(block, launch.FWD_TILE)  # short rows share a program: QK-norm's 128 -> 32
        widest = block * element_size == launch.SINGLE_BLOCK_BYTES
        assert bwd.kind == ("wide" if widest else "tile"), dim
        if not widest:  # the pipelined tile: a fixed number of elements a thread, three stages
            assert bwd.stages == launch.BWD_STAGES and bwd.rows * block == max(block, launch.BWD_TILE)
            assert bwd.rows * block // (32 * bwd.warps) <= launch.BWD_ELEMENTS_PER_THREAD


def test_the_tables_shapes_for_the_sizes_training_uses():
    assert row_settings(768, 2).forward == launch.KernelShape("tile", 1024, 4, 8)
    assert row_settings(768, 2).backward == launch.KernelShape("tile", 1024, 2, 4, 3)
    assert row_settings(128, 2).backward.rows == 16  # QK-norm over head_dim: 16 heads' rows a tile
    assert row_settings(16384, 2).backward.kind == "wide" and row_settings(8192, 4).backward.kind == "wide"
    assert not row_settings(16385, 2).single_block and not row_settings(8193, 4).single_block


@pytest.mark.parametrize(
    "registers, shared, warps, expected",
    [
        (64, 24 * 1024, 8, 4),  # registers bind: 64 x 32 x 8 = 16K of the SM's 64K
        (32, 100 * 1024, 4, 2),  # shared memory binds: 2 x (100 KB + 1 KB) <= 228 KB
        (32, 0, 8, 8),  # threads bind: 2048 / 256
        (16, 0, 1, 32),  # the cap of 32 programs an SM
        (255, 0, 16, 0),  # 255 registers (rounded to 256 a thread) x 512 threads: more than the SM has
        (129, 0, 4, 3),  # 129 registers are allocated as 136: 4352 a warp, 15 warps
    ],
)
def test_programs_per_sm_is_the_tightest_resource(registers, shared, warps, expected):
    assert programs_per_sm(registers, shared, warps, H100_SXM) == expected


def test_the_interpreter_gets_a_small_fixed_grid():
    """It runs programs one after another: a wave means nothing there, and few programs are fastest."""
    import torch

    from norms.fused import ops

    cpu = torch.device("cpu")
    variant = ops.launch_for(8, torch.float32, None, cpu, False, 2, False, False)
    assert ops._wave(variant, torch.float32, torch.float32, 8, cpu) == launch.INTERPRETER_PROGRAMS
