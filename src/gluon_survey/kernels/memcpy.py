"""Rung 0, the memory roofline: a copy ladder, src -> dst over a flat buffer.

Why a copy: a GEMM with few rows (a decode step, a skinny weight) reads its weight once and does
little arithmetic per byte, so its floor is how fast this GPU moves bytes from HBM and back. A
copy does nothing else; its bytes read plus bytes written over its time is that floor as a kernel
can reach it (`gluon-survey memcpy` measures it, beside `Tensor.copy_` and the datasheet). Each
step below is the previous one plus one idea:

1. **One element per thread** (`scalar`): a `BlockedLayout` with size_per_thread [1], a block of
   32 x num_warps elements per program. Each thread moves one element per instruction (2 bytes of
   fp16: LDG.E.U16 / STG.E.U16). A warp's accesses are adjacent, so they coalesce, but each
   instruction carries an eighth of what it could, and each program copies a few hundred bytes
   before it retires, so the SM spends its issue slots and block launches on bookkeeping.
2. **A 16-byte vector per thread** (`vector`): size_per_thread = 16 // element size, so each
   thread's elements are contiguous and one 128-bit instruction moves them (LDG.E.128 /
   STG.E.128); a warp instruction covers 512 contiguous bytes, four whole 128-byte lines. Nothing
   else changes, but the block grows with the vector. A 128-bit access needs a 16-byte aligned
   address: the kernel states it (`gl.multiple_of` on the pointers, so that a compile without a
   GPU, which knows nothing of the buffers, produces the code a launch runs) and `prepare` checks
   it on the host.
3. **A small search** (`search`) over what sets the bytes in flight, since by Little's law
   bandwidth = bytes in flight / memory latency: REPS (1, 2, 4) vectors per thread per block (the
   layout tiles the block REPS times, so each instruction still covers 512 contiguous bytes per
   warp and a thread has REPS loads outstanding before its first store), num_warps (4, 8), and a
   persistent grid-stride loop (one resident wave of programs, as many per SM as it has warp slots
   for, each walking blocks pid, pid + grid, ...) against one program per block (the hardware
   launches and retires every block). 12 configs; the driver measures all and reports the best.
   REPS goes through the layout's tiling rather than a wider size_per_thread: a thread's 32 or 64
   contiguous bytes would spread one warp instruction over two or four times the lines.

Masks, the same at every step: full blocks take an unmasked path, only the last block is masked.
A mask `offsets < n` is uniform over a vector only when n is a multiple of the vector, and Triton
knows that only when it specialised n as a multiple of 16 at launch; otherwise a masked access is
split into one instruction per element. So with masks on every block an odd size would copy at
step 1's width; this way it loses only its last block. (A compile without a GPU cannot specialise
n either: its SASS shows the tail's per-element accesses beside the body's vectors.)

Offsets are 32-bit: a buffer has at most MAX_ELEMENTS elements (4 GiB of fp16).
"""

from __future__ import annotations

from dataclasses import dataclass

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..launch import CompileSpec, Launch, Target

VECTOR_BYTES = 16  # the widest global access an sm_90 thread issues (LDG.E.128)
WARP_SIZE = 32
MAX_WARPS_PER_SM = 64  # resident warps per SM on sm_80, sm_90 and sm_100
MAX_ELEMENTS = 2**31 - 2**16  # int32 offsets: the last block's may run past n by a block
# The same two numbers as the kernels see them (a @gluon.jit function reads only constexpr globals).
_VECTOR_BYTES = gl.constexpr(VECTOR_BYTES)
_WARP_SIZE = gl.constexpr(WARP_SIZE)

__all__ = [
    "MAX_ELEMENTS",
    "SEARCH",
    "VARIANTS",
    "CopyConfig",
    "Variant",
    "check_buffers",
    "compile_specs",
    "copy_kernel",
    "copy_persistent_kernel",
    "prepare",
    "search_configs",
    "vector_elements",
]


# ------------------------------------------------------------------------------------------------
# Device code


@gluon.jit
def _copy_block(src, dst, start, n, BLOCK: gl.constexpr, layout: gl.constexpr):
    """Copy elements [start, start + BLOCK) that lie below n, spread over the threads by `layout`."""
    offsets = start + gl.arange(0, BLOCK, layout=layout)
    # The buffers are 16-byte aligned (prepare checks it) and every block starts a whole number of
    # vectors into them, so each thread's contiguous run starts on a 16-byte boundary.
    src_ptrs = gl.multiple_of(src + offsets, [_VECTOR_BYTES])
    dst_ptrs = gl.multiple_of(dst + offsets, [_VECTOR_BYTES])
    if start <= n - BLOCK:  # a full block: no mask, so nothing splits the vectors
        gl.store(dst_ptrs, gl.load(src_ptrs))
    else:  # the last, partial block
        mask = offsets < n
        gl.store(dst_ptrs, gl.load(src_ptrs, mask=mask), mask=mask)


@gluon.jit
def copy_kernel(src, dst, n, SIZE_PER_THREAD: gl.constexpr, BLOCK: gl.constexpr):
    """One program per BLOCK elements (steps 1, 2 and half of 3's configs)."""
    layout: gl.constexpr = gl.BlockedLayout([SIZE_PER_THREAD], [_WARP_SIZE], [gl.num_warps()], [0])
    _copy_block(src, dst, gl.program_id(0) * BLOCK, n, BLOCK, layout)


@gluon.jit
def copy_persistent_kernel(src, dst, n, SIZE_PER_THREAD: gl.constexpr, BLOCK: gl.constexpr):
    """A resident wave of programs, each copying blocks pid, pid + grid, pid + 2 grid, ..."""
    layout: gl.constexpr = gl.BlockedLayout([SIZE_PER_THREAD], [_WARP_SIZE], [gl.num_warps()], [0])
    for block in range(gl.program_id(0), gl.cdiv(n, BLOCK), gl.num_programs(0)):
        _copy_block(src, dst, block * BLOCK, n, BLOCK, layout)


# ------------------------------------------------------------------------------------------------
# Configs and variants


@dataclass(frozen=True)
class CopyConfig:
    """How one copy launch distributes a buffer: `size_per_thread` contiguous elements per access
    (the layout's), `reps` accesses per thread per block, `num_warps`, and whether the grid is one
    persistent wave or one program per block."""

    size_per_thread: int
    reps: int = 1
    num_warps: int = 4
    persistent: bool = False

    @property
    def block(self) -> int:
        """Elements per block: the layout's footprint, tiled `reps` times."""
        return self.size_per_thread * WARP_SIZE * self.num_warps * self.reps

    @property
    def kernel(self):
        return copy_persistent_kernel if self.persistent else copy_kernel

    def grid(self, numel: int, sm_count: int) -> int:
        """Programs to launch: one per block, or (persistent) as many per SM as its warp slots
        hold (MAX_WARPS_PER_SM // num_warps), never more than there are blocks."""
        blocks = triton.cdiv(numel, self.block)
        if not self.persistent:
            return blocks
        return min(blocks, sm_count * (MAX_WARPS_PER_SM // self.num_warps))

    def label(self, element_size: int) -> str:
        """e.g. '16B x2 w8 persistent': bytes per access, accesses per thread, warps, grid."""
        grid = "persistent" if self.persistent else "per-block"
        return f"{self.size_per_thread * element_size}B x{self.reps} w{self.num_warps} {grid}"

    def as_dict(self) -> dict[str, object]:
        return {
            "size_per_thread": self.size_per_thread,
            "reps": self.reps,
            "num_warps": self.num_warps,
            "persistent": self.persistent,
            "block": self.block,
        }


def vector_elements(element_size: int) -> int:
    """Elements in one 16-byte vector (8 for fp16/bf16); 1 for elements of 16 bytes or more."""
    return max(1, VECTOR_BYTES // element_size)


# Step 3's search space: what sets the bytes in flight (see the module docstring).
SEARCH = {"reps": (1, 2, 4), "num_warps": (4, 8), "persistent": (False, True)}


def search_configs(element_size: int) -> list[CopyConfig]:
    """Step 3's configs for this element size, in a fixed order (the first is step 2's)."""
    vec = vector_elements(element_size)
    return [
        CopyConfig(vec, reps, warps, persistent)
        for persistent in SEARCH["persistent"]
        for warps in SEARCH["num_warps"]
        for reps in SEARCH["reps"]
    ]


@dataclass(frozen=True)
class Variant:
    """One step of the ladder: its number, name, the idea it adds, and how to get its configs."""

    step: int
    name: str
    idea: str

    def configs(self, element_size: int) -> list[CopyConfig]:
        if self.step == 1:
            return [CopyConfig(size_per_thread=1)]
        if self.step == 2:
            return [CopyConfig(vector_elements(element_size))]
        return search_configs(element_size)


VARIANTS = (
    Variant(1, "scalar", "one element per thread: each access is one element wide"),
    Variant(2, "vector", "a 16-byte vector per thread: 128-bit, warp-coalesced accesses"),
    Variant(3, "search", "best of REPS x num_warps x persistent: more bytes in flight per SM"),
)


# ------------------------------------------------------------------------------------------------
# Host side


def check_buffers(src, dst) -> None:
    """ValueError unless src and dst are contiguous CUDA buffers of one dtype and size, 16-byte
    aligned (the kernels promise the compiler that much), of at most MAX_ELEMENTS elements."""
    if src.dtype != dst.dtype or src.numel() != dst.numel():
        raise ValueError(f"src and dst differ: {src.dtype}[{src.numel()}] vs {dst.dtype}[{dst.numel()}]")
    if not (src.is_cuda and dst.is_cuda):
        raise ValueError("src and dst must be CUDA tensors")
    if not (src.is_contiguous() and dst.is_contiguous()):
        raise ValueError("src and dst must be contiguous (the kernels copy a flat buffer)")
    if src.data_ptr() % VECTOR_BYTES or dst.data_ptr() % VECTOR_BYTES:
        raise ValueError(f"src and dst must start on a {VECTOR_BYTES}-byte boundary")
    if src.numel() > MAX_ELEMENTS:
        raise ValueError(f"{src.numel()} elements; the kernels' 32-bit offsets allow {MAX_ELEMENTS}")


def prepare(src, dst, cfg: CopyConfig, target: Target) -> Launch:
    """A launch that copies src into dst with `cfg` (an empty buffer launches nothing)."""
    check_buffers(src, dst)
    numel = src.numel()
    grid = (cfg.grid(numel, target.sm_count),)
    kernel = cfg.kernel

    def run() -> None:
        if numel:
            kernel[grid](src, dst, numel, cfg.size_per_thread, cfg.block, num_warps=cfg.num_warps)

    return Launch(run, {"label": cfg.label(src.element_size()), **cfg.as_dict(), "grid": grid[0]})


# Triton's pointer types for the dtypes `compile_specs` is asked about, and their sizes in bytes.
_TRITON_TYPES = {"float16": ("fp16", 2), "bfloat16": ("bf16", 2), "float32": ("fp32", 4), "int8": ("i8", 1)}


def compile_specs(capability: tuple[int, int], dtype: str = "float16") -> list[CompileSpec]:
    """Every config of every step for a GPU-less compile (capability is not used: the copy is the
    same code on sm_90 and sm_100). `n` is compiled without the launch's divisibility
    specialisation, so the masked tail shows as per-element accesses beside the vectors."""
    ty, size = _TRITON_TYPES[dtype]
    specs = []
    for variant in VARIANTS:
        for cfg in variant.configs(size):
            specs.append(
                CompileSpec(
                    mode="memcpy",
                    kernel=f"{variant.step} {variant.name} {cfg.label(size)}",
                    fn=cfg.kernel,
                    signature={
                        "src": f"*{ty}",
                        "dst": f"*{ty}",
                        "n": "i32",
                        "SIZE_PER_THREAD": "constexpr",
                        "BLOCK": "constexpr",
                    },
                    constexprs={"SIZE_PER_THREAD": cfg.size_per_thread, "BLOCK": cfg.block},
                    options={"num_warps": cfg.num_warps},
                    config=cfg,
                )
            )
    return specs
