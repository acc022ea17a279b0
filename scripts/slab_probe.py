"""Where a slab program's time goes beyond a plain read's (docs/perf-notes.md, entry 26).

Three sets of kernel-only times (CUPTI, cold L2: scripts/kernel_time.py's clock) on the decode
shapes where slab misses 0.90 of rung 0, bf16:

* `stream`: the slab's TMA ring with no consumer (no operand loads, no MMA): each stage is waited
  for, the CTA barrier and the fence are paid, and the stage is refilled, exactly as slab_kernel
  does. ORDER 0 walks the weight as slab does ([BW, BK] boxes, a program's rows over K), 1 the
  same with each program starting at another K step (rotated by its id), 2 the same bytes as a
  flat contiguous stream (a program reads one contiguous range, BW x BK elements a stage).
* `probe`: a copy of slab_kernel with two switches: MMA (0: the stages are waited for and released
  but not read) and ROTATE (each program starts at another K step).
* the package's `slab` and a plain-Triton `read` of as many bytes, for reference.

Then one launch of each probe kernel with CLOCKS=1 writes per program: %globaltimer (ns, one clock
for all SMs) at its start, after its first stage landed and after its last; SM cycles (%clock64)
spent waiting for stages and in the whole loop. Summarized as medians and spreads.

Not part of the package: an experiment, run on the GPU with

    PYTHONPATH=src python3 scripts/slab_probe.py --output $OUT/slab-probe.csv
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

sys.path.insert(0, str(Path(__file__).parent))
from kernel_time import call_of, check_close, flush_buffers, operands, probe_parser, record, timed, write_csv

from gluon_survey.api import target_of
from gluon_survey.compat import cta_barrier, tma_load
from gluon_survey.driver.shapes import Shape
from gluon_survey.kernels import slab
from gluon_survey.kernels.common import Ring, init_barriers, invalidate_barriers, load_step
from gluon_survey.kernels.plan import make_descriptors, smem_layout
from gluon_survey.kernels.splitk import store_sum
from gluon_survey.kernels.swapab import swapped_operands

SHAPES = [(1, 4096, 4096), (16, 4096, 4096), (1, 6144, 4096), (64, 4096, 14336), (1, 10240, 8192)]
CLOCK_FIELDS = ("start_ns", "first_ns", "end_ns", "wait_cycles", "loop_cycles")


@gluon.jit
def _now(token, GLOBAL: gl.constexpr):
    """%globaltimer (ns) or %clock64 (SM cycles); `token` only orders the read after a value."""
    if GLOBAL:
        asm: gl.constexpr = "mov.u64 $0, %globaltimer;"
    else:
        asm: gl.constexpr = "mov.u64 $0, %clock64;"
    return gl.inline_asm_elementwise(asm + " // $1", "=l,r", [token], dtype=gl.int64, is_pure=False, pack=1)


@gluon.jit
def probe_kernel(
    x_desc,
    w_desc,
    c_desc,
    clocks,
    W_KMAJOR: gl.constexpr,
    STAGES: gl.constexpr,
    MMA: gl.constexpr,
    ROTATE: gl.constexpr,
    CLOCKS: gl.constexpr,
):
    """slab_kernel (fp16/bf16) with the switches of the module docstring."""
    BLOCK_T: gl.constexpr = c_desc.block_type.shape[0]
    BLOCK_W: gl.constexpr = c_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = x_desc.block_type.shape[1]
    pid = gl.program_id(0)
    if CLOCKS:
        start_ns = _now(pid, True)
        start_cycles = _now(pid, False)
    k_steps = gl.cdiv(x_desc.shape[1], BLOCK_K)
    num_pid_t = gl.cdiv(c_desc.shape[0], BLOCK_T)
    off_w = (pid // num_pid_t) * BLOCK_W
    off_t = (pid % num_pid_t) * BLOCK_T
    rot = 0
    if ROTATE:
        rot = pid % k_steps

    x_bufs = gl.allocate_shared_memory(x_desc.dtype, [STAGES] + x_desc.block_type.shape, x_desc.layout)
    w_bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES] + w_desc.block_type.shape, w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    init_barriers(ready, STAGES)
    for i in gl.static_range(STAGES):
        load_step(
            x_desc, w_desc, off_t, off_w, ((i + rot) % k_steps) * BLOCK_K, ready.index(i), x_bufs.index(i),
            w_bufs.index(i), W_KMAJOR, i < k_steps,
        )  # fmt: skip

    layout: gl.constexpr = slab.slab_layout(gl.num_warps())
    KW: gl.constexpr = slab.k_width(x_desc.dtype)
    SUB_K: gl.constexpr = 256 // x_desc.dtype.primitive_bitwidth
    acc = gl.zeros([BLOCK_W, BLOCK_T], gl.float32, layout)
    waited = pid.to(gl.int64) * 0
    first_ns = pid.to(gl.int64) * 0
    ring = Ring.start(STAGES)
    for k in range(k_steps):
        slot = ring.slot()
        if CLOCKS:
            before = _now(k, False)
        ring.wait_filled(ready)
        if CLOCKS:
            waited += _now(k, False) - before
            if k == 0:
                first_ns = _now(k, True)
        if MMA:
            w_view, xt_view = swapped_operands(x_bufs.index(slot), w_bufs.index(slot), W_KMAJOR)
            for j in gl.static_range(BLOCK_K // SUB_K):
                w = w_view.slice(j * SUB_K, SUB_K, dim=1).load(gl.DotOperandLayout(0, layout, KW))
                xt = xt_view.slice(j * SUB_K, SUB_K, dim=0).load(gl.DotOperandLayout(1, layout, KW))
                acc = mma_v2(w, xt, acc)
        cta_barrier()
        fence_async_shared()
        load_step(
            x_desc, w_desc, off_t, off_w, ((k + STAGES + rot) % k_steps) * BLOCK_K, ready.index(slot),
            x_bufs.index(slot), w_bufs.index(slot), W_KMAJOR, k + STAGES < k_steps,
        )  # fmt: skip
        ring = ring.next()
    invalidate_barriers(ready, STAGES)
    if CLOCKS:
        end_ns = _now(k_steps, True)
        loop_cycles = _now(k_steps, False) - start_cycles
        base = clocks + pid * 5
        gl.store(base, start_ns)
        gl.store(base + 1, first_ns)
        gl.store(base + 2, end_ns)
        gl.store(base + 3, waited)
        gl.store(base + 4, loop_cycles)
    store_sum(c_desc, gl.permute(acc, (1, 0)), off_t, off_w, 0, 0, 0)


@gluon.jit
def stream_kernel(w_desc, k_steps, STAGES: gl.constexpr, ORDER: gl.constexpr):
    """The slab's ring over a weight alone, no consumer (ORDER: see the module docstring)."""
    pid = gl.program_id(0)
    rot = 0
    if ORDER == 1:
        rot = pid % k_steps
    bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES] + w_desc.block_type.shape, w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    init_barriers(ready, STAGES)
    for i in gl.static_range(STAGES):
        step = (i + rot) % k_steps
        _stream_load(w_desc, pid, step, k_steps, ready.index(i), bufs.index(i), ORDER, i < k_steps)
    ring = Ring.start(STAGES)
    for k in range(k_steps):
        slot = ring.slot()
        ring.wait_filled(ready)
        cta_barrier()
        fence_async_shared()
        _stream_load(
            w_desc, pid, (k + STAGES + rot) % k_steps, k_steps, ready.index(slot), bufs.index(slot), ORDER,
            k + STAGES < k_steps,
        )  # fmt: skip
        ring = ring.next()
    invalidate_barriers(ready, STAGES)


@gluon.jit
def _stream_load(w_desc, pid, step, k_steps, bar, buf, ORDER: gl.constexpr, pred):
    BLOCK_W: gl.constexpr = w_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = w_desc.block_type.shape[1]
    mbarrier.expect(bar, w_desc.block_type.nbytes, pred)
    if ORDER == 2:  # a flat [N * K / BK, BK] view: the program's range, BW rows of it a stage
        tma_load(w_desc, [(pid * k_steps + step) * BLOCK_W, 0], bar, buf, pred)
    else:
        tma_load(w_desc, [pid * BLOCK_W, step * BLOCK_K], bar, buf, pred)


def stream_call(w: torch.Tensor, rows: int, block_k: int, stages: int, order: int):
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    N, K = w.shape
    src = w.view(-1, block_k) if order == 2 else w
    block = [rows, block_k]
    desc = TensorDescriptor.from_tensor(src, block, smem_layout(block, gl.bfloat16))
    grid = (triton.cdiv(N, rows),)
    steps = triton.cdiv(K, block_k)
    return lambda: stream_kernel[grid](desc, steps, STAGES=stages, ORDER=order, num_warps=rows // 16)


def probe_call(a, b, rows: int, mma: int, rotate: int, clocks: torch.Tensor | None = None):
    """The probe kernel over a @ b with slab's default config at this M, `rows` weight rows a
    program; the ring depth slab.prepare would choose."""
    from dataclasses import replace

    target = target_of(a.device)
    M, N = a.shape[0], b.shape[1]
    cfg = replace(slab.config_for(target.capability, a.shape[1]), BLOCK_N=rows, num_warps=rows // 16)
    cfg = replace(cfg, BLOCK_M=slab.tokens_for(M))
    grid = (slab.programs_for(cfg, M, N),)
    cfg = replace(cfg, STAGES=slab.stages_for(cfg, grid[0], target.sm_count))
    out = torch.empty(M, N, device=a.device, dtype=a.dtype)
    descs = make_descriptors(a, b, out, cfg, "t")
    buf = clocks if clocks is not None else torch.empty(1, device=a.device, dtype=torch.int64)
    flags = {"W_KMAJOR": True, "STAGES": cfg.STAGES, "MMA": mma, "ROTATE": rotate}
    flags["CLOCKS"] = clocks is not None

    def fn():
        probe_kernel[grid](*descs, buf, **flags, num_warps=cfg.num_warps)
        return out

    return fn, grid[0], cfg.STAGES


def summary(clk: torch.Tensor) -> dict[str, float]:
    """Medians and spreads of one clocked launch, in µs (ns fields) and as a fraction of cycles."""
    c = clk.view(-1, 5).double().cpu()
    t0 = c[:, 0].min()
    start, first, end = ((c[:, i] - t0) / 1e3 for i in (0, 1, 2))
    wait_frac = c[:, 3] / c[:, 4]
    q = lambda x: statistics.quantiles(x.tolist(), n=10)  # noqa: E731
    return {
        "start_p50": start.median().item(), "start_p90": q(start)[-1], "start_max": start.max().item(),
        "first_p50": first.median().item(), "first_max": first.max().item(),
        "end_min": end.min().item(), "end_p50": end.median().item(), "end_max": end.max().item(),
        "wait_frac_p50": wait_frac.median().item(), "wait_frac_min": wait_frac.min().item(),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = probe_parser(__doc__).parse_args(argv)
    flush, sink = flush_buffers()
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    rows, clock_rows = [], []
    for M, N, K in SHAPES:
        a, b, _ = operands(Shape(M, N, K), "bf16", "tensor")
        w = b.t()  # the [N, K] weight
        moved = a.numel() * 2 + w.numel() * 2 + M * N * 2
        variants = {"read": call_of("read", a, b, {}, moved)[0], "slab": call_of("slab", a, b, {}, None)[0]}
        for r in (16, 32, 64):
            for mma in (1, 0):
                for rot in (0, 1):
                    variants[f"probe w{r} mma{mma} rot{rot}"] = probe_call(a, b, r, mma, rot)[0]
            # the ring slab's grid would get at M = 1 (8-token stages) on this GPU
            stages = slab.stages_for(
                slab.SlabConfig(BLOCK_M=8, BLOCK_N=r, num_warps=r // 16), triton.cdiv(N, r), sm_count
            )
            for order in (0, 1, 2):
                variants[f"stream w{r} s{stages} order{order}"] = stream_call(w, r, 256, stages, order)
        ref = a.float() @ w.float().t()
        for name, fn in variants.items():
            if name.startswith("probe") and "mma1" in name:
                check_close(f"{name} at {M}x{N}x{K}", fn(), ref, 1e-2)
            record(rows, {"M": M, "N": N, "K": K, "variant": name, **timed(fn, args.reps, flush, sink)[1]})
        for r in (32, 64):
            for mma in (1, 0):
                clk = torch.zeros(triton.cdiv(N, r) * 5, device="cuda", dtype=torch.int64)
                fn, programs, stages = probe_call(a, b, r, mma, 0, clk)
                for _ in range(3):  # the last of three launches, each after an L2 flush
                    flush.sum()
                    fn()
                torch.cuda.synchronize()
                s = summary(clk[: programs * 5])
                row = {"M": M, "N": N, "K": K, "rows": r, "mma": mma, "programs": programs, "stages": stages}
                row |= {k: round(v, 3) for k, v in s.items()}
                clock_rows.append(row)
                print(row, flush=True)
    write_csv(args.output, rows)
    write_csv(args.output.replace(".csv", "-clocks.csv"), clock_rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
