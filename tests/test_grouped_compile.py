"""The grouped kernels (kernels/grouped.py, kernels/grouped_swapab.py) compile for sm_90a on a
machine with no GPU, and their machine code is what their docstrings claim: wgmma (HGMMA, one per
16 of BLOCK_K per K step; for the swap-AB kernel 64 weight rows by the token tile, 64xBLOCK_T;
with fp8 e4m3 operands QGMMA, one per 32, in both kernels, and no 16-bit MMA), TMA loads
(UTMALDG) and no TMA store (the epilogue is a masked register store, STG), no local-memory
spills (fp8: with the row-wise scales' loads in the epilogue; in the swap-AB kernel two
multiplies for each element of C's tile, its token's scale and its channel's), and the shared
memory of the ring (plus the epilogue's layout-conversion scratch). The 128-row kernel with the
SwiGLU fused into its epilogue (GLU 1, 16-bit) against the unfused kernel of the same MMA tile:
one wgmma as wide over the gate and up boxes, three TMA loads for two, half the stores, an exp2
and a reciprocal per output element, no spills.

They are the registry's `grouped` and `grouped-swapab` modes, which the dense rungs' compile
tests leave out (a grouped mode's kernel is no rung of the dense ladder), so their specs are
compiled here rather than through tests/kernel_reports.py's `compiled_report`; the same rule
holds: the triton-3.9 pass (`-m "compile and not exhaustive"`) compiles the first spec of each
design (`design`), and the others are marked `exhaustive`."""

from __future__ import annotations

import dataclasses
import functools

import pytest
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from gluon_survey.driver import inspect as gs_inspect
from gluon_survey.kernels import common
from gluon_survey.kernels import grouped as gk
from gluon_survey.kernels import grouped_swapab as gs
from gluon_survey.launch import CompileSpec
from kernel_reports import design

pytestmark = pytest.mark.compile

ARCH = "sm_90a"
FP8 = "float8_e4m3fn"
DTYPES = ("float16", "bfloat16", FP8)  # the first of a design is its representative
SIXTEEN_BIT = DTYPES[:2]
# dtype -> (the wgmma's SASS opcode, the K one instruction covers)
MMA = {"float16": ("HGMMA", 16), "bfloat16": ("HGMMA", 16), FP8: ("QGMMA", 32)}


KERNELS = {"grouped": gk, "grouped-swapab": gs}  # mode -> kernel module


@functools.cache
def compiled(dtype: str, index: int, mode: str = "grouped"):
    spec = KERNELS[mode].compile_specs((9, 0), dtype)[index]
    return spec, gs_inspect.inspect_spec(spec, ARCH)


def _params():
    seen, params = set(), []
    for dtype in DTYPES:
        for index, spec in enumerate(gk.compile_specs((9, 0), dtype)):
            # the wide tile's epilogue traces a split of the accumulator into column slices
            key = (design(spec, ARCH), spec.config.BLOCK_N // spec.config.EPILOGUE_N)
            marks = () if key not in seen else (pytest.mark.exhaustive,)
            seen.add(key)
            params.append(
                pytest.param(dtype, index, id=f"{spec.kernel.replace(' ', '-')}-{dtype}", marks=marks)
            )
    return params


PARAMS = _params()


def test_two_specs_per_dtype_and_both_tiles_of_both_kinds_compiled_by_the_triton_39_pass():
    assert len(PARAMS) == 2 * len(DTYPES)
    assert [p.id for p in PARAMS if not p.marks] == [
        "grouped_kernel-128x128x64-s4-w8-E<=512-B=t-float16",
        "grouped_kernel-128x256x64-s4-w8-E<=512-B=t-float16",
        f"grouped_kernel-128x128x128-fp8-s4-w8-E<=512-B=t-scales=row-{FP8}",
        f"grouped_kernel-128x256x128-fp8-s4-w8-E<=512-B=t-scales=row-{FP8}",
    ]


@pytest.mark.parametrize(("dtype", "index"), PARAMS)
def test_grouped_machine_code(dtype, index):
    spec, r = compiled(dtype, index)
    assert r.error is None, r.error
    cfg = spec.config
    mma, k_per_mma = MMA[dtype]
    assert r.count(mma) == cfg.BLOCK_K // k_per_mma, f"one wgmma per {k_per_mma} of K per K step: {r.sass}"
    other = "QGMMA" if mma == "HGMMA" else "HGMMA"
    assert r.count(other) == 0 and r.count("HMMA") == 0 and r.count("UTCHMMA") == 0
    # the scales' multiplies (row, then column) on the fp32 accumulator: fp8 only, the 16-bit path unchanged
    assert (r.count("FMUL") > 0) == (dtype == FP8), r.count("FMUL")
    assert r.count("UTMALDG") > 0, "TMA loads expected"
    assert r.count("UTMASTG") == 0 and r.count("STG") > 0, "a masked register store, not a TMA store"
    assert r.count("LDL") == 0 and r.count("STL") == 0, "local-memory traffic (spills)"
    assert r.spill_bytes == 0 and r.stack_bytes == 0
    # the epilogue's layout-conversion scratch lies beside the ring, which holds the next tile's loads
    assert cfg.smem_bytes() < r.shared_bytes <= common.SMEM_LIMIT


SWAPAB_PARAMS = [
    pytest.param(
        dtype,
        index,
        id=f"{spec.kernel.replace(' ', '-')}-{dtype}",
        # two designs: 16-bit, and fp8 with its scales' epilogue
        marks=() if (dtype, index) in ((SIXTEEN_BIT[0], 0), (FP8, 0)) else (pytest.mark.exhaustive,),
    )
    for dtype in DTYPES
    for index, spec in enumerate(gs.compile_specs((9, 0), dtype))
]


def test_three_token_tiles_per_dtype_of_two_designs():
    assert len(SWAPAB_PARAMS) == 3 * len(DTYPES)
    designs = {dtype: {design(spec, ARCH) for spec in gs.compile_specs((9, 0), dtype)} for dtype in DTYPES}
    # the token tile and the ring only size it; fp8 (SCALING 2) traces the scales' epilogue too
    assert designs["float16"] == designs["bfloat16"] and len(designs["float16"]) == 1
    assert len(designs[FP8]) == 1 and designs[FP8] != designs["float16"]
    assert [p.id for p in SWAPAB_PARAMS if not p.marks] == [
        "grouped_swapab_kernel-W64xT16x256-s4-w4-E<=512-B=t-float16",
        f"grouped_swapab_kernel-W64xT16x256-fp8-s8-w4-E<=512-B=t-scales=row-{FP8}",
    ]


@pytest.mark.parametrize(("dtype", "index"), SWAPAB_PARAMS)
def test_grouped_swapab_machine_code(dtype, index):
    spec, r = compiled(dtype, index, "grouped-swapab")
    assert r.error is None, r.error
    cfg = spec.config
    mma, k_per_mma = MMA[dtype]
    # swapped: the wgmma's M is 64 weight rows, its N the token tile (fp8: e4m3 both, K-major both)
    shape = f"{mma}.64x{cfg.BLOCK_T}x{k_per_mma}.F32"
    assert sum(n for op, n in r.sass.items() if op.startswith(shape)) == cfg.BLOCK_K // k_per_mma, r.sass
    assert r.count(mma) == cfg.BLOCK_K // k_per_mma, f"one wgmma per {k_per_mma} of K per K step"
    other = "QGMMA" if mma == "HGMMA" else "HGMMA"
    assert r.count(other) == 0 and r.count("HMMA") == 0 and r.count("UTCHMMA") == 0
    # fp8: each of a thread's elements of C's [BLOCK_T, 64] tile times its token's scale and its
    # channel's, on the fp32 accumulator; 16-bit: no multiply at all (that path is unchanged)
    per_thread = cfg.BLOCK_T * cfg.BLOCK_W // (32 * r.num_warps)
    assert r.count("FMUL") == (2 * per_thread if dtype == FP8 else 0), r.count("FMUL")
    assert r.count("UTMALDG") > 0, "TMA loads expected"
    assert r.count("UTMASTG") == 0 and r.count("STG") > 0, "a masked register store, not a TMA store"
    assert r.count("LDL") == 0 and r.count("STL") == 0, "local-memory traffic (spills)"
    assert r.spill_bytes == 0 and r.stack_bytes == 0
    assert r.num_warps == 4  # one warpgroup
    assert cfg.smem_bytes() < r.shared_bytes <= common.SMEM_LIMIT


@pytest.mark.parametrize(
    ("mode", "dtype"),
    [("grouped", "bfloat16"), ("grouped", FP8), ("grouped-swapab", "bfloat16"), ("grouped-swapab", FP8)],
)
def test_sizes_of_one_compile_as_constexprs(mode, dtype):
    """Triton specializes an int argument equal to 1 as a constexpr: a launch with S = 1 (one
    token), N = 1 or E = 1 traces the kernel with constants in their place (fp8: the scales'
    epilogue too, its masks and the expert's scale row e * N with constants)."""
    spec = KERNELS[mode].compile_specs((9, 0), dtype)[0]
    ones = {"S": 1, "N": 1, "E": 1}
    spec = dataclasses.replace(
        spec,
        signature=spec.signature | dict.fromkeys(ones, "constexpr"),
        constexprs=spec.constexprs | ones,
    )
    r = gs_inspect.inspect_spec(spec, ARCH)
    assert r.error is None, r.error
    assert r.count(MMA[dtype][0]) > 0 and r.spill_bytes == 0


@gluon.jit
def _lookup_kernel(offs, found, t, S, N, E, EXPERTS_PAD: gl.constexpr):
    """The kernel's schedule and one tile's lookup, alone: what a program does once, and then at
    each tile."""
    prefix, total = gk._schedule(offs, S, E, gl.cdiv(N, 128), 128, EXPERTS_PAD)
    e, start, count, pid_m, pid_n = gk._tile_of(t, prefix, offs, S, E, gl.cdiv(N, 128), 128, 16)
    gl.store(found, total + e + start + count + pid_m + pid_n)


@pytest.mark.parametrize("num_warps", [gk.CONFIGS[9].num_warps, gs.CONFIGS[9][16].num_warps])
def test_the_tile_lookup_stays_inside_each_warp(num_warps):
    """Every warp holds the offsets' table whole, so the prefix scan and the per-tile lookups are
    shuffles and warp reductions: no shared memory and no CTA barrier, which inside the K loop
    would stall the warpgroups (two in the 128-row kernel, one in the swap-AB kernel)."""
    spec = CompileSpec(
        "grouped",
        "schedule lookup",
        _lookup_kernel,
        {"offs": "*i32", "found": "*i32", "t": "i32", "S": "i32", "N": "i32", "E": "i32"}
        | {"EXPERTS_PAD": "constexpr"},
        {"EXPERTS_PAD": gk.MAX_EXPERTS},
        {"num_warps": num_warps},
        divisible=("offs",),
    )
    c = gs_inspect.compile_spec(spec, ARCH)
    assert "tt.scan" in c.ttgir and c.ptx.count("shfl.sync") > 0
    assert c.shared_bytes == 0
    assert "bar.sync" not in c.ptx and "st.shared" not in c.ptx and "ld.shared" not in c.ptx


# The fused SwiGLU (GLU 1, 16-bit): the unfused kernel's MMA tile over a stage of two weight boxes
GLU_PARAMS = [
    pytest.param(
        dtype,
        index,
        id=f"{spec.kernel.replace(' ', '-')}-{dtype}",
        # both tiles of one dtype: the narrow one's epilogue is one slice, the wide one's a split
        marks=() if dtype == SIXTEEN_BIT[0] else (pytest.mark.exhaustive,),
    )
    for dtype in SIXTEEN_BIT
    for index, spec in enumerate(gk.compile_specs((9, 0), dtype, glu=True))
]


@functools.cache
def compiled_glu(dtype: str, index: int):
    spec = gk.compile_specs((9, 0), dtype, glu=True)[index]
    return spec, gs_inspect.inspect_spec(spec, ARCH)


def test_two_glu_tiles_per_16_bit_dtype_and_none_for_fp8():
    assert len(GLU_PARAMS) == 2 * len(SIXTEEN_BIT) and gk.compile_specs((9, 0), FP8, glu=True) == []
    assert [p.id for p in GLU_PARAMS if not p.marks] == [
        "grouped_kernel-128x128x64-swiglu-s4-w8-E<=512-B=t-float16",
        "grouped_kernel-128x256x64-swiglu-s4-w8-E<=512-B=t-float16",
    ]


@pytest.mark.parametrize(("dtype", "index"), GLU_PARAMS)
def test_grouped_glu_machine_code(dtype, index):
    """Against the unfused kernel of the same MMA tile (same BLOCK_N weight rows a stage): the same
    wgmma per K step, 64 x BLOCK_N (a warpgroup's rows by both boxes: gate and up columns in one
    MMA), three TMA loads where it issues two (x, the gate box, the up box), half the stores
    (BLOCK_N / 2 output columns), and for each output element of a thread one exp2 and one
    reciprocal more (silu's, on the MUFU); no spills, the same shared memory."""
    spec, r = compiled_glu(dtype, index)
    assert r.error is None, r.error
    cfg = spec.config
    plain_spec, plain = compiled(dtype, index)
    assert plain_spec.config.BLOCK_N == cfg.BLOCK_N and cfg.out_n == cfg.BLOCK_N // 2
    shape = f"HGMMA.64x{cfg.BLOCK_N}x16.F32"
    assert sum(n for op, n in r.sass.items() if op.startswith(shape)) == cfg.BLOCK_K // 16, r.sass
    assert r.count("HGMMA") == cfg.BLOCK_K // 16 and r.count("QGMMA") == 0 and r.count("HMMA") == 0
    assert r.count("UTMALDG") * 2 == plain.count("UTMALDG") * 3, (r.count("UTMALDG"), plain.count("UTMALDG"))
    assert r.count("UTMASTG") == 0 and r.count("STG") * 2 == plain.count("STG")
    outputs_per_thread = cfg.BLOCK_M * cfg.out_n // (32 * r.num_warps)
    assert r.count("MUFU") - plain.count("MUFU") == 2 * outputs_per_thread, (
        r.count("MUFU"),
        plain.count("MUFU"),
    )
    assert r.count("LDL") == 0 and r.count("STL") == 0, "local-memory traffic (spills)"
    assert r.spill_bytes == 0 and r.stack_bytes == 0
    assert r.shared_bytes == plain.shared_bytes and cfg.smem_bytes() < r.shared_bytes <= common.SMEM_LIMIT
