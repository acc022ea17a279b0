"""The small-M rungs without a GPU: splitk and swapab compile for sm_90a and sm_100a, with both B
layouts (fp8: B=t, row-wise scales), and their SASS is what they claim: the tensor-core MMA of
the architecture and operand type (for swapab on Hopper, a wgmma as narrow as its token tile),
one atomic per program (the tile counter; none in swapab's persistent tiles, which never split K),
TMA loads and stores, the wait and the release of a programmatic dependent launch, no spills, the
shared memory the config computes."""

from __future__ import annotations

import pytest

from kernel_reports import compiled_report, config_marks, specs

pytestmark = pytest.mark.compile

FP8 = "float8_e4m3fn"
CASES = [
    pytest.param(
        mode, arch, dtype, i, id=f"{mode}-{arch}-{dtype}-{i}", marks=config_marks(mode, arch, dtype, i)
    )
    for mode in ("splitk", "swapab")
    for arch in ("sm_90a", "sm_100a")
    for dtype in ("float16", "bfloat16", FP8)
    for i in range(len(specs(mode, arch, dtype)))
]
# The MMAs of 16-bit and of fp8 operands (fp8: True): (Hopper's wgmma, Blackwell's tcgen05).
MMAS = {False: ("HGMMA", "UTCHMMA"), True: ("QGMMA", "UTCQMMA")}


@pytest.mark.parametrize(("mode", "arch", "dtype", "index"), CASES)
def test_split_k_rung_machine_code(mode, arch, dtype, index):
    spec, r = compiled_report(mode, arch, dtype, index)
    assert r.error is None, r.error
    fp8 = dtype == FP8
    wgmma, tcgen05 = MMAS[fp8]
    assert all(r.count(op) == 0 for op in MMAS[not fp8]), "no MMA of the other operand type"
    if arch == "sm_90a":
        width = spec.config.BLOCK_N  # swapab: the token tile is the wgmma's N
        k = 32 if fp8 else 16  # 32 bytes of operands per wgmma
        assert any(op.startswith(f"{wgmma}.64x{width}x{k}.F32") for op in r.sass), r.sass
        assert r.count(tcgen05) == 0
    else:
        assert r.count(tcgen05) > 0 and r.count(wgmma) == 0
        assert r.count("LDTM") > 0
    if getattr(spec.config, "PERSISTENT", 0):  # swapab's persistent whole-K tile: no split, no counter
        assert r.count("ATOMG") == 0
    else:
        assert r.count("ATOMG") == 1, "one arrival on the tile counter per program"
    assert r.count("UTMALDG") > 0 and r.count("UTMASTG") > 0
    # programmatic dependent launch: one wait for the kernel before (griddepcontrol.wait, ACQBULK)
    # and one release of the kernel after (griddepcontrol.launch_dependents, PREEXIT)
    assert r.count("ACQBULK") == 1 and r.count("PREEXIT") == 1
    assert r.spill_bytes == 0 and r.count("LDL") == 0 and r.count("STL") == 0
    assert 0 <= r.shared_bytes - spec.config.smem_bytes() < 512
