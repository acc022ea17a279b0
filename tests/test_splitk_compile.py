"""The small-M rungs without a GPU: splitk and swapab compile for sm_90a and sm_100a, with both B
layouts, and their SASS is what they claim: the tensor-core MMA of the architecture (for swapab
on Hopper, a wgmma as narrow as its token tile), one atomic per program (the tile counter), TMA
loads and stores, no spills, the shared memory the config computes."""

from __future__ import annotations

import pytest

from kernel_reports import compiled_report, specs

pytestmark = pytest.mark.compile

CASES = [
    pytest.param(mode, arch, dtype, i, id=f"{mode}-{arch}-{dtype}-{i}")
    for mode in ("splitk", "swapab")
    for arch in ("sm_90a", "sm_100a")
    for dtype in ("float16", "bfloat16")
    for i in range(len(specs(mode, arch, dtype)))
]


@pytest.mark.parametrize(("mode", "arch", "dtype", "index"), CASES)
def test_split_k_rung_machine_code(mode, arch, dtype, index):
    spec, r = compiled_report(mode, arch, dtype, index)
    assert r.error is None, r.error
    if arch == "sm_90a":
        width = spec.config.BLOCK_N  # swapab: the token tile is the wgmma's N
        assert any(op.startswith(f"HGMMA.64x{width}x16.F32") for op in r.sass), r.sass
        assert r.count("UTCHMMA") == 0
    else:
        assert r.count("UTCHMMA") > 0 and r.count("HGMMA") == 0
        assert r.count("LDTM") > 0
    assert r.count("ATOMG") == 1, "one arrival on the tile counter per program"
    assert r.count("UTMALDG") > 0 and r.count("UTMASTG") > 0
    assert r.spill_bytes == 0 and r.count("LDL") == 0 and r.count("STL") == 0
    assert 0 <= r.shared_bytes - spec.config.smem_bytes() < 512
