"""Grouped GEMM for mixture-of-experts layers (Hopper): out[rows of expert e] = x[rows of e] @ w[e].

The idea: persistent + a tile list over experts. One persistent launch walks every expert's output
tiles; each expert's token range comes from device-side offsets (`offs`, int32 [E], cumulative
ends, as `torch._grouped_mm` and transformers take them), so there is no host sync and the launch
is CUDA-graph capturable; zero-token experts contribute no tiles.

Status: compile-checked for sm_90a on a machine without a GPU (tests/test_grouped_compile.py);
it has not been run or measured yet (tests/test_grouped_gpu.py is written for a GPU session).

How the tiles are laid out. x [S, K] holds the tokens grouped by expert (expert e's rows are
offs[e-1] .. offs[e] - 1, offs[-1] taken as 0), w is the [E, N, K] weight (transformers passes
its [E, K, N] transpose view) read K-major through one 2-D TMA descriptor over its [E * N, K]
reshape. Each program loops over a virtual tile index t in [0, E * tiles_m * tiles_n), with
tiles_m = cdiv(S, BLOCK_M) an upper bound of any expert's row tiles: t names expert e, row tile
pid_m and column tile pid_n, and a tile whose first row is past the expert's token count is
skipped (two scalar loads of `offs`), which is how zero-token experts cost nothing but the skip.
The grid depends on S, N and E only, never on the offsets' values.

Reads and writes of other experts' rows: an A box starting at offs[e-1] + pid_m * BLOCK_M may run
past offs[e] into the next expert's rows, and a B box of the last column tile runs past N into the
next expert's weight rows; both only add to output rows or columns that the epilogue does not
write. So the epilogue is a masked register store (rows < the expert's count, columns < N), not a
TMA store. K tails are zero-filled by TMA (past K) and so add nothing.

Offsets are clamped to [0, S] on the device, and an expert whose end is below its start (a
decreasing pair) is empty: checking that the offsets never decrease would need a host sync
(`gluon_survey.grouped.check_offsets` does it, for debugging). Rows at or past offs[-1] are not
written.

The K loop is Pipelined's ring (STAGES - 1 TMA loads in flight behind one wgmma), its position
counted over the program's whole tile list so the mbarrier phases stay right across tiles. This
first step keeps the loop plain: no overlap of one tile's epilogue with the next tile's loads.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..launch import CompileSpec, Launch, Target
from .arch import select_mma
from .common import SMEM_LIMIT, Ring, init_barriers, invalidate_barriers, load_step, mbarrier
from .plan import GL_DTYPES, Launcher, desc_signature, smem_layout

__all__ = ["CONFIGS", "GroupedConfig", "compile_specs", "grouped_kernel", "prepare", "unsupported_reason"]

_POINTER_TYPES = {"float16": "*fp16", "bfloat16": "*bf16"}


@dataclass(frozen=True)
class GroupedConfig:
    """Tile and launch shape of the grouped kernel. Building one whose ring does not fit in a
    block's shared memory raises ValueError."""

    BLOCK_M: int = 128
    BLOCK_N: int = 128
    BLOCK_K: int = 64
    STAGES: int = 4
    num_warps: int = 8

    def __post_init__(self):
        if self.STAGES < 2:
            raise ValueError(f"STAGES must be at least 2 (loads in flight behind the MMA), got {self.STAGES}")
        if self.smem_bytes() > SMEM_LIMIT:
            raise ValueError(
                f"{self.label} needs {self.smem_bytes()} B of shared memory; a block has {SMEM_LIMIT}"
            )

    def smem_bytes(self) -> int:
        """Shared memory of the operand ring (16-bit operands). The epilogue's layout conversion
        takes scratch memory of its own, which the compiler may lay over the ring."""
        return self.STAGES * (self.BLOCK_M + self.BLOCK_N) * self.BLOCK_K * 2

    @property
    def label(self) -> str:
        return f"{self.BLOCK_M}x{self.BLOCK_N}x{self.BLOCK_K} s{self.STAGES} w{self.num_warps}"

    def table(self) -> dict[str, object]:
        return {
            "BLOCK_M": self.BLOCK_M,
            "BLOCK_N": self.BLOCK_N,
            "BLOCK_K": self.BLOCK_K,
            "stages": self.STAGES,
            "warps": self.num_warps,
        }


# Hopper: Pipelined's 128-wide N with a deeper ring: 4 stages of 32 KB.
CONFIGS = {9: GroupedConfig(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, STAGES=4, num_warps=8)}


def unsupported_reason(capability: tuple[int, int]) -> str | None:
    """The grouped kernel multiplies with wgmma: sm_90 only, for now."""
    if capability[0] in CONFIGS:
        return None
    return f"the grouped kernel runs on Hopper (sm_90) only; this GPU is sm_{capability[0]}{capability[1]}"


@gluon.jit
def _expert_rows(offs, e, S):
    """(first row, row count) of expert e: offs[e-1] (0 for e = 0) to offs[e], clamped to [0, S];
    a count below zero (decreasing offsets) reads as an empty expert."""
    prev = gl.load(offs + gl.maximum(e - 1, 0))
    start = prev * (e > 0).to(gl.int32)
    end = gl.load(offs + e)
    start = gl.minimum(gl.maximum(start, 0), S)
    end = gl.minimum(gl.maximum(end, 0), S)
    return start, end - start


@gluon.jit
def _store_rows(out, acc, start, count, row0, off_n, N):
    """Rows row0 .. row0 + BLOCK_M - 1 of the expert whose rows start at `start` (only those below
    `count`), columns off_n .. (only those below N): acc -> output dtype -> a coalesced layout ->
    masked stores into the row-major [S, N] output."""
    BLOCK_M: gl.constexpr = acc.shape[0]
    BLOCK_N: gl.constexpr = acc.shape[1]
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
    c = gl.convert_layout(acc.to(out.dtype.element_ty), layout)
    rows = row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
    cols = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
    mask = gl.expand_dims(rows < count, 1) & gl.expand_dims(cols < N, 0)
    offsets = gl.expand_dims((start + rows).to(gl.int64) * N, 1) + gl.expand_dims(cols, 0)
    gl.store(out + offsets, c, mask=mask)


@gluon.jit
def grouped_kernel(a_desc, b_desc, out, offs, S, N, E, MMA: gl.constexpr, STAGES: gl.constexpr):
    """a_desc: x [S, K], block [BLOCK_M, BLOCK_K]; b_desc: the weight as [E * N, K], block
    [BLOCK_N, BLOCK_K]; out: row-major [S, N]; offs: int32 [E], cumulative ends of the experts' rows."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    dtype: gl.constexpr = a_desc.dtype
    k_steps = gl.cdiv(a_desc.shape[1], BLOCK_K)
    tiles_m = gl.cdiv(S, BLOCK_M)
    tiles_n = gl.cdiv(N, BLOCK_N)
    per_expert = tiles_m * tiles_n

    a_bufs = gl.allocate_shared_memory(dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    init_barriers(ready, STAGES)

    base = gl.to_tensor(0)  # the ring's position: K steps this program has run, over all its tiles
    for t in range(gl.program_id(0), E * per_expert, gl.num_programs(0)):
        e = t // per_expert
        r = t - e * per_expert
        pid_m = r // tiles_n
        pid_n = r - pid_m * tiles_n
        start, count = _expert_rows(offs, e, S)
        row0 = pid_m * BLOCK_M
        if row0 < count:
            off_m = start + row0
            off_n = pid_n * BLOCK_N
            w_row = e * N + off_n
            for s in gl.static_range(STAGES - 1):
                slot = Ring(base + s, STAGES).slot()
                load_step(
                    a_desc,
                    b_desc,
                    off_m,
                    w_row,
                    s * BLOCK_K,
                    ready.index(slot),
                    a_bufs.index(slot),
                    b_bufs.index(slot),
                    True,
                    pred=s < k_steps,
                )
            mma = MMA.initialize(dtype, BLOCK_M, BLOCK_N, gl.num_warps())
            for k in range(k_steps):
                ring = Ring(base + k, STAGES)
                ring.wait_filled(ready)
                slot = ring.slot()
                mma = mma.issue(a_bufs.index(slot), b_bufs.index(slot).permute((1, 0)))
                mma = mma.wait(1)  # retires MMA k-1, whose stage is the one refilled next
                nxt = k + STAGES - 1
                refill = Ring(base + nxt, STAGES).slot()
                load_step(
                    a_desc,
                    b_desc,
                    off_m,
                    w_row,
                    nxt * BLOCK_K,
                    ready.index(refill),
                    a_bufs.index(refill),
                    b_bufs.index(refill),
                    True,
                    pred=nxt < k_steps,
                )
            acc, mma = mma.take_result()
            base = base + k_steps
            _store_rows(out, acc, start, count, row0, off_n, N)
    invalidate_barriers(ready, STAGES)


def constexprs(cfg: GroupedConfig, capability: tuple[int, int]) -> dict[str, object]:
    """The kernel's constexprs, for its launch and its compile specs alike."""
    return {"MMA": select_mma(capability), "STAGES": cfg.STAGES}


def _dtype_name(t) -> str:
    return str(t.dtype).removeprefix("torch.")


def prepare(x, w, offs, out, target: Target, cfg: GroupedConfig | None = None) -> Launch:
    """A ready launch of out[rows of e] = x[rows of e] @ w[e] for every expert e. x [S, K]
    row-major, w the [E, K, N] transpose view of a contiguous [E, N, K] weight, offs int32 [E] on
    the GPU, out row-major [S, N]; S, N, K > 0 and K a multiple of 8 (TMA's 16-byte row stride).
    `gluon_survey.grouped.grouped_matmul` checks all of that first."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    reason = unsupported_reason(target.capability)
    if reason:
        raise RuntimeError(reason)
    cfg = cfg or CONFIGS[target.capability[0]]
    S, K = x.shape
    E, _, N = w.shape
    weight = w.transpose(1, 2).reshape(E * N, K)  # a view of the contiguous [E, N, K] weight
    gdt = GL_DTYPES[_dtype_name(x)]
    a_block, b_block = [cfg.BLOCK_M, cfg.BLOCK_K], [cfg.BLOCK_N, cfg.BLOCK_K]
    a_desc = TensorDescriptor.from_tensor(x, a_block, smem_layout(a_block, gdt))
    b_desc = TensorDescriptor.from_tensor(weight, b_block, smem_layout(b_block, gdt))
    tiles = E * triton.cdiv(S, cfg.BLOCK_M) * triton.cdiv(N, cfg.BLOCK_N)
    grid = (max(1, min(target.sm_count, tiles)),)
    launcher = Launcher(grouped_kernel, grid, constexprs(cfg, target.capability), cfg.num_warps)
    args = (a_desc, b_desc, out, offs, S, N, E)
    return Launch(lambda: launcher(*args), cfg.table())


def compile_specs(capability: tuple[int, int], dtype: str = "float16") -> list[CompileSpec]:
    """The spec of the config this architecture runs, for a compile without a GPU (none where the
    kernel does not run, or for other dtypes). S, N, E are plain int32 arguments; out and offs are
    compiled as 16-byte aligned, as torch allocates them."""
    if unsupported_reason(capability) or dtype not in _POINTER_TYPES:
        return []
    cfg = CONFIGS[capability[0]]
    values = constexprs(cfg, capability)
    signature = {
        "a_desc": desc_signature([cfg.BLOCK_M, cfg.BLOCK_K], dtype),
        "b_desc": desc_signature([cfg.BLOCK_N, cfg.BLOCK_K], dtype),
        "out": _POINTER_TYPES[dtype],
        "offs": "*i32",
        "S": "i32",
        "N": "i32",
        "E": "i32",
    } | dict.fromkeys(values, "constexpr")
    return [
        CompileSpec(
            "grouped",
            f"grouped_kernel {cfg.label} B=t",
            grouped_kernel,
            signature,
            values,
            {"num_warps": cfg.num_warps},
            config=cfg,
            divisible=("out", "offs"),
        )
    ]
