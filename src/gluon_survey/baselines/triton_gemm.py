"""The `triton` mode: a persistent, TMA-based GEMM in plain Triton (`@triton.jit`, `tl`), autotuned.

This is the baseline that answers "what does the ordinary Triton compiler get for the same algorithm
the Gluon ladder writes by hand?". It follows the design of Triton's tutorial
`09-persistent-matmul.py`, written for this project:

* **Persistent.** The grid is `min(#SMs, #tiles)`; program `p` walks tiles `p, p + #SMs, ...` in one
  `tl.range(..., flatten=True)` loop, so the compiler can pipeline across tile boundaries (the next
  tile's first loads overlap the current tile's epilogue).
* **Grouped tile order** (`GROUP_M = 8`): consecutive tile ids sweep a band of 8 tile rows column by
  column, so the B tiles a band shares are reused from L2.
* **TMA** through host-side `triton.tools.tensor_descriptor.TensorDescriptor`s (no device-side
  descriptors, hence no `triton.set_allocator`); the compiler turns `desc.load`/`desc.store` into
  TMA copies and software-pipelines the K loop over `num_stages` shared-memory buffers.
* **fp32 accumulation**, output in the input dtype (fp16/bf16).
* **fp8 e4m3** operands: the same kernel with e4m3 descriptors, B always K-major (the
  api passes fp8 B only as the transpose view of an [N, K] weight, which fp8 wgmma needs), output
  in `out`'s dtype (bf16 or fp16). The dequantization scales (`launch.Scales`, flat fp32) are
  kernel arguments and a constexpr `SCALING` (0 none, 1 per-tensor, 2 row-wise) applies them to
  the fp32 accumulator before the store: `acc * (sa * sb)`, or `acc * sa[rows][:, None] *
  sb[cols][None, :]` with the scale loads masked at M and N (Triton loads the column scales one
  per thread and moves them into the accumulator's layout through BLOCK_N * 4 bytes of shared
  memory). Without scales the kernel gets None and SCALING = 0, so the fp16/bf16 kernels compile
  to the same SASS as before fp8. On sm_90a `tl.dot` of e4m3 tiles is QGMMA (wgmma `.e4m3`, e.g.
  `QGMMA.64x256x32.F32.E4M3.E4M3`) with Triton's Hopper default `max_num_imprecise_acc = 2**30`:
  the accumulator stays in the tensor cores' reduced-precision accumulation over the whole K loop
  (what `torch._scaled_mm(..., use_fast_accum=True)` asks of cuBLAS), whose error grows with K.
  The `torch` baseline runs `_scaled_mm`'s default `use_fast_accum=False` (cuBLAS promotes partial
  sums to fp32). Triton's promotion, `max_num_imprecise_acc=BLOCK_K` (an fp32 add of each K step's
  partial product), was compiled and left out: a second accumulator, 128 FADDs per thread per K
  step, and at 128x256x128 / 8 warps 255 registers with 80-120 bytes of spills (triton 3.6 / 3.9).
  tests/test_baselines_gpu.py::test_fp8_triton_deep_k measures the fast accumulation against the
  survey's tolerance at K = 4096.
* **Both B layouts**, a constexpr switch `B_KMAJOR`: row-major `[K, N]` B is described as is with
  block `[BLOCK_K, BLOCK_N]`; the transpose view of a contiguous `[N, K]` weight (B layout "t")
  is described through `b.T` (contiguous `[N, K]`) with block `[BLOCK_N, BLOCK_K]` and fed to
  `tl.dot` as `tile.T`, which wgmma/tcgen05 read K-major from shared memory without a copy.

Autotuning space (8 configs per operand size before pruning; `_autotune_configs` lists both
sizes' 16 and the prune keeps the launch's 8):

    BLOCK_M = 128, BLOCK_N in {128, 256}, num_stages in {3, 4}, num_warps in {4, 8},
    BLOCK_K = 128 bytes of K per tile row: 64 for fp16/bf16, 128 for fp8

Why this small space: 128x256x64 / 3 stages / 8 warps is the Hopper sweet spot of Triton's
tutorials and the tile of most Gluon rungs, 128x128x64 / 4 warps the best occupancy-2
point of 05-wgmma. Left out, each of which would double the tuning time: BLOCK_K = 128 (with 2
stages it lost clearly on Hopper in Triton's tutorials), `warp_specialize` (plain Triton honours it
only on Blackwell) and EPILOGUE_SUBTILE (it frees shared memory for a 4th stage, and a 4th stage
did not help on Hopper, perf-notes entry 2); for fp8, BLOCK_K = 128 is the same 128-byte row,
the widest TMA/wgmma swizzle, and keeps each K step's bytes (and so the stage budget) equal to
fp16's. `_prune_configs` then drops, before anything compiles:

* configs of the other operand size (BLOCK_K not 128 bytes of the launch's operands);
* configs whose shared memory (`stages * (A tile + B tile) + C tile`, operands at their element
  size, C at the output's) exceeds the GPU's opt-in limit, e.g. 128x256x64 with 4 stages
  (192 KB + 64 KB > 227 KB), and in fp8 with a bf16 output 128x256x128 with 4 stages, the same
  bytes; so fp8 keeps the same five configs as fp16/bf16 on Hopper;
* where the accumulator lives in registers (every GPU but sm_100-class Blackwell, whose tcgen05
  accumulates in tensor memory), configs whose fp32 accumulator would need more than 128 registers
  per thread (`BLOCK_M * BLOCK_N / (32 * num_warps)`), i.e. 128x256 on 4 warps: compiled for
  sm_90a it spills (255 registers, a 1 KB stack); for sm_100a it does not (213 registers).

So five configs are timed on H100/H200 and six on B200. On a GPU where none fits (sm_120: ~99 KB
of shared memory) the prune falls back to 128x128 / 4 warps (BLOCK_K of the operand size) with as
many stages as fit (>= 2).

The tuning key is `(M, N, K, B_KMAJOR, SCALING)`. Triton's autotuner adds no dtype because the
kernel takes descriptors (the fp32 scales add "torch.float32" to the key whenever they are given),
so fp16 and bf16 of one shape share the choice (they run at the same tensor-core rate), while
SCALING (0 for fp16/bf16, 1 or 2 for fp8) keeps fp8 runs apart from them, and per-tensor apart from
row-wise (a different epilogue).

`prepare(a, b, out, target, scales=None)` does not launch anything. Its `Launch.config` dict first
holds only the static facts (`GROUP_M`); the **first call** of `Launch.fn` runs the autotuner
(benchmarking the pruned configs, then running the winner) and then fills in `BLOCK_M`, `BLOCK_N`,
`BLOCK_K`, `stages`, `warps` and `grid` of the chosen config. Later calls launch that config
directly through the JIT function, skipping the autotuner's per-call bookkeeping, so timed calls
pay the same dispatch cost as the Gluon rungs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from gluon_survey.launch import CompileSpec, Launch, Scales, Target, b_layout, is_kmajor

GROUP_M = 8
ACC_REGS_MAX = 128  # fp32 accumulator registers per thread above which a config is pruned
K_TILE_BYTES = 128  # bytes of a tile row along K: BLOCK_K = 64 for fp16/bf16, 128 for fp8
# Representative SM counts for GPU-less compiles only (NUM_SMS is the persistent loop's stride).
_COMPILE_NUM_SMS = {9: 132, 10: 148}
# compile_specs' dtype argument (torch names, as `inspect` passes them; short names accepted too)
# -> Triton's type names in signatures.
_TRITON_DTYPES = {
    "float16": "fp16",
    "bfloat16": "bf16",
    "float8_e4m3fn": "fp8e4nv",
    "fp16": "fp16",
    "bf16": "bf16",
    "fp8": "fp8e4nv",
    "fp8e4m3": "fp8e4nv",
}


# ----------------------------------------------------------------------------------------------
# Device code
# ----------------------------------------------------------------------------------------------


@triton.jit
def _grouped_tile(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """Tile id -> (pid_m, pid_n): bands of GROUP_M tile rows, each swept column by column."""
    tiles_per_band = GROUP_M * num_pid_n
    band = tile_id // tiles_per_band
    first_m = band * GROUP_M
    rows = tl.minimum(num_pid_m - first_m, GROUP_M)  # the last band may be shorter
    in_band = tile_id % tiles_per_band
    return first_m + in_band % rows, in_band // rows


@triton.jit
def persistent_matmul_kernel(
    a_desc,  # [M, K], block [BLOCK_M, BLOCK_K]
    b_desc,  # [K, N] block [BLOCK_K, BLOCK_N]; or, if B_KMAJOR, [N, K] block [BLOCK_N, BLOCK_K]
    c_desc,  # [M, N], block [BLOCK_M, BLOCK_N]
    M,
    N,
    K,
    scale_a,  # fp8: fp32 scales, 1 element (SCALING 1) or M (SCALING 2); None without scales
    scale_b,  # fp8: fp32 scales, 1 element or N
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    NUM_SMS: tl.constexpr,
    B_KMAJOR: tl.constexpr,
    SCALING: tl.constexpr,  # 0 none, 1 per-tensor, 2 row-wise (launch.Scales.code)
):
    """C = A @ B (times the fp8 scales), one program per SM looping over output tiles in grouped order."""
    start = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    k_steps = tl.cdiv(K, BLOCK_K)

    # Upstream 09-persistent-matmul recomputes the epilogue's tile from a second counter to keep it
    # independent of the next tile's prologue in the flattened loop. With triton 3.6 and 3.9 this
    # kernel compiles to the same pipeline without it (same TTGIR ops; ~50 fewer SASS
    # instructions), so the store reuses off_m / off_n.
    for tile_id in tl.range(start, num_tiles, NUM_SMS, flatten=True):
        pid_m, pid_n = _grouped_tile(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N

        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ks in range(k_steps):
            off_k = ks * BLOCK_K
            a = a_desc.load([off_m, off_k])  # out-of-bounds rows/cols read as zero
            if B_KMAJOR:
                b = b_desc.load([off_n, off_k]).T  # [BLOCK_N, BLOCK_K] -> K-major view
            else:
                b = b_desc.load([off_k, off_n])
            acc = tl.dot(a, b, acc)

        if SCALING == 1:  # per-tensor: one factor for the whole product
            acc = acc * (tl.load(scale_a) * tl.load(scale_b))
        elif SCALING == 2:  # row-wise: a factor per row of A and per column of B
            rows = off_m + tl.arange(0, BLOCK_M)
            cols = off_n + tl.arange(0, BLOCK_N)
            sa = tl.load(scale_a + rows, mask=rows < M, other=0.0)
            sb = tl.load(scale_b + cols, mask=cols < N, other=0.0)
            acc = acc * sa[:, None] * sb[None, :]
        c_desc.store([off_m, off_n], acc.to(c_desc.dtype))  # TMA clips the ragged edges


# ----------------------------------------------------------------------------------------------
# Autotuning space
# ----------------------------------------------------------------------------------------------


def _set_block_shapes(nargs: dict) -> None:
    """Config pre-hook: give the host descriptors the block shapes of the config about to run."""
    bm, bn, bk = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"]
    nargs["a_desc"].block_shape = [bm, bk]
    nargs["b_desc"].block_shape = [bn, bk] if nargs["B_KMAJOR"] else [bk, bn]
    nargs["c_desc"].block_shape = [bm, bn]


def block_k(elem_bytes: int) -> int:
    """BLOCK_K of an operand size: 128-byte tile rows, i.e. 64 for fp16/bf16 and 128 for fp8."""
    return K_TILE_BYTES // elem_bytes


def _config(block_n: int, stages: int, warps: int, elem_bytes: int = 2) -> triton.Config:
    meta = {"BLOCK_M": 128, "BLOCK_N": block_n, "BLOCK_K": block_k(elem_bytes), "GROUP_M": GROUP_M}
    return triton.Config(meta, num_stages=stages, num_warps=warps, pre_hook=_set_block_shapes)


def _autotune_configs() -> list[triton.Config]:
    """The documented space (module docstring): per operand size (2 bytes: fp16/bf16, 1 byte: fp8,
    which sets BLOCK_K), 2 tile widths x 2 stage counts x 2 warp counts; the prune keeps the 8 of
    the launch's operand size."""
    return [
        _config(bn, s, w, elem_bytes)
        for elem_bytes in (2, 1)
        for bn in (128, 256)
        for s in (3, 4)
        for w in (4, 8)
    ]


def smem_bytes(cfg: triton.Config, elem_bytes: int, out_bytes: int | None = None) -> int:
    """Shared memory a config needs: `num_stages` A+B operand buffers of `elem_bytes`-byte elements
    plus the C staging tile of `out_bytes`-byte elements (default: the operands' size)."""
    bm, bn, bk = cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_N"], cfg.kwargs["BLOCK_K"]
    out_bytes = elem_bytes if out_bytes is None else out_bytes
    return cfg.num_stages * (bm * bk + bk * bn) * elem_bytes + bm * bn * out_bytes


def acc_regs_per_thread(cfg: triton.Config) -> int:
    """fp32 accumulator registers per thread when the accumulator lives in registers (wgmma)."""
    return cfg.kwargs["BLOCK_M"] * cfg.kwargs["BLOCK_N"] // (32 * cfg.num_warps)


def prune_configs(
    configs: list[triton.Config],
    smem_limit: int,
    elem_bytes: int,
    acc_in_tmem: bool = False,
    out_bytes: int | None = None,
) -> list[triton.Config]:
    """Drop configs that cannot fit the GPU, and those of the other operand size (module
    docstring); never returns an empty list."""
    kept = [
        c
        for c in configs
        if c.kwargs["BLOCK_K"] == block_k(elem_bytes)
        and smem_bytes(c, elem_bytes, out_bytes) <= smem_limit
        and (acc_in_tmem or acc_regs_per_thread(c) <= ACC_REGS_MAX)
    ]
    if kept:
        return kept
    stages = 4
    while stages > 2 and smem_bytes(_config(128, stages, 4, elem_bytes), elem_bytes, out_bytes) > smem_limit:
        stages -= 1
    return [_config(128, stages, 4, elem_bytes)]


def _prune_configs(configs: list[triton.Config], named_args: dict, **kwargs: object) -> list[triton.Config]:
    """Autotuner hook: `prune_configs` for the launching GPU (shared-memory limit, accumulator home)
    and the launch's operand and output element sizes."""
    base = named_args["a_desc"].base
    index = base.device.index
    return prune_configs(
        configs,
        _smem_limit(index),
        base.element_size(),
        _capability(index)[0] == 10,
        out_bytes=named_args["c_desc"].base.element_size(),
    )


@functools.cache
def _capability(device_index: int | None) -> tuple[int, int]:
    index = torch.cuda.current_device() if device_index is None else device_index
    return torch.cuda.get_device_capability(index)


@functools.cache
def _smem_limit(device_index: int | None) -> int:
    # The same figure Triton checks a compiled kernel against before raising OutOfResources.
    index = torch.cuda.current_device() if device_index is None else device_index
    return triton.runtime.driver.active.utils.get_device_properties(index)["max_shared_mem"]


_autotuned_matmul = triton.autotune(
    configs=_autotune_configs(),
    key=["M", "N", "K", "B_KMAJOR", "SCALING"],
    prune_configs_by={"early_config_prune": _prune_configs},
)(persistent_matmul_kernel)


# ----------------------------------------------------------------------------------------------
# Host side: the provider contract (gluon_survey.registry)
# ----------------------------------------------------------------------------------------------


def unsupported_reason(capability: tuple[int, int]) -> str | None:
    """TMA descriptors need Hopper (sm_90) or newer."""
    if capability < (9, 0):
        return f"needs TMA, i.e. compute capability >= 9.0 (this GPU is {capability[0]}.{capability[1]})"
    return None


def _descriptor(t: torch.Tensor, block: list[int]) -> TensorDescriptor:
    """A 2-D descriptor over `t` (unit inner stride). The outer stride of a single-row tensor is never
    used, so it is replaced by a 16-byte-aligned value the descriptor check accepts."""
    rows, cols = t.shape
    row_stride = t.stride(0)
    if rows == 1:
        align = 16 // t.element_size()
        row_stride = max(align, (cols + align - 1) // align * align)
    return TensorDescriptor(t, [rows, cols], [row_stride, 1], block)


def prepare(
    a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, target: Target, scales: Scales | None = None
) -> Launch:
    """Descriptors and grid for out = a @ b, or for fp8 operands out = (a @ b) * scales; no launch
    (see the module docstring for `config`)."""
    m, k = a.shape
    n = b.shape[1]
    kmajor = is_kmajor(b_layout(b))
    if scales is not None and not kmajor:
        raise ValueError("fp8 operands need B as the transpose view of an [N, K] weight (K-major)")
    config: dict[str, object] = {"GROUP_M": GROUP_M}
    if m == 0 or n == 0:
        return Launch(lambda: None, {**config, "impl": "empty output, nothing to do"})
    if k == 0:
        return Launch(out.zero_, {**config, "impl": "K == 0: zero fill"})

    # Block shapes are placeholders: the config pre-hook sets the chosen config's before each launch.
    bk = block_k(a.element_size())
    a_desc = _descriptor(a, [128, bk])
    b_desc = _descriptor(b.T, [128, bk]) if kmajor else _descriptor(b, [bk, 128])
    c_desc = _descriptor(out, [128, 128])
    num_sms = target.sm_count
    # Without scales the kernel gets None (a constexpr): fp16/bf16 compile as they did before fp8.
    scale_args = (None, None) if scales is None else (scales.a, scales.b)
    constexprs = {"NUM_SMS": num_sms, "B_KMAJOR": kmajor, "SCALING": 0 if scales is None else scales.code}

    def grid_size(meta: dict) -> int:
        return min(num_sms, triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]))

    args = (a_desc, b_desc, c_desc, m, n, k, *scale_args)
    launch_direct: Callable[[], object] | None = None

    def fn() -> None:
        nonlocal launch_direct
        if launch_direct is not None:
            launch_direct()
            return
        _autotuned_matmul[lambda meta: (grid_size(meta),)](*args, **constexprs)
        best = _autotuned_matmul.best_config  # the config that call ran; the pre-hook left its blocks set
        meta = best.all_kwargs()
        grid = (grid_size(meta),)
        config.update(
            BLOCK_M=meta["BLOCK_M"],
            BLOCK_N=meta["BLOCK_N"],
            BLOCK_K=meta["BLOCK_K"],
            stages=best.num_stages,
            warps=best.num_warps,
            grid=grid[0],
        )
        launch_direct = functools.partial(persistent_matmul_kernel[grid], *args, **constexprs, **meta)

    return Launch(fn, config)


# ----------------------------------------------------------------------------------------------
# GPU-less compilation for `gluon-survey inspect`
# ----------------------------------------------------------------------------------------------

# (BLOCK_N, stages, warps, B_KMAJOR): the Hopper sweet spot, the occupancy-friendly small tile, and
# the sweet spot again with a transposed [N, K] weight.
_INSPECT_CONFIGS = ((256, 3, 8, False), (128, 4, 4, False), (256, 3, 8, True))
# fp8 reads B K-major only: the sweet spot and the small tile, both on an [N, K] weight.
_INSPECT_CONFIGS_FP8 = ((256, 3, 8, True), (128, 4, 4, True))
FP8_INSPECT_SCALING = 2  # fp8 specs compile the row-wise epilogue, the one with more work in it


def compile_specs(capability: tuple[int, int], dtype: str = "float16") -> list[CompileSpec]:
    """Representative configs of the autotuning space, for `inspect` to compile without a GPU.

    `dtype` is "float16", "bfloat16" or "float8_e4m3fn" (fp8 e4m3 operands, a bf16 output and
    row-wise scales). NUM_SMS is a representative SM count (it only sets the persistent loop's
    stride).
    """
    if unsupported_reason(capability) is not None:
        return []
    ty = _TRITON_DTYPES[dtype]
    fp8 = ty == "fp8e4nv"
    out_ty = "bf16" if fp8 else ty
    num_sms = _COMPILE_NUM_SMS.get(capability[0], 132)
    specs = []
    for block_n, stages, warps, kmajor in _INSPECT_CONFIGS_FP8 if fp8 else _INSPECT_CONFIGS:
        bm, bk = 128, block_k(1 if fp8 else 2)
        b_block = [block_n, bk] if kmajor else [bk, block_n]
        signature = {
            "a_desc": f"tensordesc<{ty}[{bm}, {bk}]>",
            "b_desc": f"tensordesc<{ty}[{b_block[0]}, {b_block[1]}]>",
            "c_desc": f"tensordesc<{out_ty}[{bm}, {block_n}]>",
            "M": "i32",
            "N": "i32",
            "K": "i32",
        }
        if fp8:
            signature.update(scale_a="*fp32", scale_b="*fp32")
        constexprs = {} if fp8 else {"scale_a": None, "scale_b": None}
        constexprs.update(
            BLOCK_M=bm,
            BLOCK_N=block_n,
            BLOCK_K=bk,
            GROUP_M=GROUP_M,
            NUM_SMS=num_sms,
            B_KMAJOR=kmajor,
            SCALING=FP8_INSPECT_SCALING if fp8 else 0,
        )
        signature.update(dict.fromkeys(constexprs, "constexpr"))
        signature = {name: signature[name] for name in persistent_matmul_kernel.arg_names}
        layout = "t" if kmajor else "row"
        scaling = " scales=row" if fp8 else ""
        specs.append(
            CompileSpec(
                mode="triton",
                kernel=f"persistent_matmul_kernel {bm}x{block_n}x{bk} s{stages} w{warps} B={layout}{scaling}",
                fn=persistent_matmul_kernel,
                signature=signature,
                constexprs=constexprs,
                options={"num_warps": warps, "num_stages": stages},
                gluon=False,
            )
        )
    return specs
