"""Where swapab's whole-K tile spends the time a bare read does not (docs/perf-notes.md, entry 29).

At 1 x 4096 x 4096 bf16 the whole-K tile (one 64-row weight tile per program, all of K through
one ring, no split) takes ~13.6 µs where a read of the same bytes takes ~12.3 and the tile's ring
alone ~12.5-12.6 (entry 26). This probe splits the difference, kernel-only (CUPTI, cold L2:
scripts/kernel_time.py's clock), on the decode shapes the tile misses 0.90 of rung 0 on:

* `probe`: a copy of swapab_kernel's SPLIT_K = 1 path (pipelined.ring_mma's loop, then the
  epilogue) with one switch, EPILOGUE: 1 the package's (`store_sum`: registers -> shared memory
  -> TMA store, waited for), 0 none (the tile is computed and dropped; a runtime flag keeps the
  compiler from removing the loop), 2 the package's with C's TMA descriptor warmed at the start
  (a TMA load of the same C box, so the store does not fetch the descriptor at the end), 3 a
  store straight from the accumulator's registers (`gl.store`, no shared memory, no TMA; masked
  at M and N). EPILOGUE 0 launches with write = 0 and compiles 3's store behind it;
* the same probe on other rings (K step, stages) with the package's epilogue;
* the package's `swapab` whole-K tile, the tile's rings alone (`slab_probe.stream_call`: the
  weight's boxes waited for and refilled, no consumer; 16-bit only) and a plain-Triton `read` of
  the GEMM's bytes, for reference.

Then one launch of each epilogue with CLOCKS=1 records per program %globaltimer (ns) at its start,
when its first stage landed, when its last MMA retired and at its end; summarized as medians and
spreads from the earliest start.

Not part of the package: an experiment, run on the GPU with

    PYTHONPATH=src python3 scripts/wholek_probe.py --output $OUT/wholek-probe.csv
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

sys.path.insert(0, str(Path(__file__).parent))
from kernel_time import call_of, check_close, flush_buffers, operands, probe_parser, record, timed, write_csv
from slab_probe import _now, stream_call

from gluon_survey.api import target_of
from gluon_survey.compat import tma_load
from gluon_survey.driver.shapes import Shape
from gluon_survey.kernels import swapab
from gluon_survey.kernels.arch import select_mma
from gluon_survey.kernels.common import Ring, init_barriers, invalidate_barriers, load_step, store_tile
from gluon_survey.kernels.plan import make_descriptors
from gluon_survey.kernels.splitk import store_sum

# (M, N, K, dtype): the 16-bit misses, and fp8's (per-tensor scale) 4096 x 14336
SHAPES = [
    (1, 4096, 4096, "bf16"),
    (16, 4096, 4096, "bf16"),
    (1, 6144, 4096, "bf16"),
    (16, 6144, 4096, "bf16"),
    (1, 4096, 14336, "fp8"),
    (16, 4096, 14336, "fp8"),
]
# (K step in bytes, stages) of the 16-token tile's ring: the package's (512, 4), deeper, narrower
RINGS = [(512, 4), (512, 5), (256, 6), (256, 8), (256, 10)]
EPILOGUES = {0: "none", 1: "tma", 2: "tma-warm", 3: "registers"}
CLOCK_FIELDS = ("start_ns", "first_ns", "last_ns", "end_ns")


@gluon.jit
def probe_kernel(
    x_desc,
    w_desc,
    c_desc,
    c_ptr,
    scale,
    clocks,
    write,
    MMA: gl.constexpr,
    STAGES: gl.constexpr,
    EPILOGUE: gl.constexpr,
    SCALED: gl.constexpr,
    CLOCKS: gl.constexpr,
):
    """swapab_kernel at SPLIT_K = 1 (K-major weight), with the switches of the module docstring;
    SCALED multiplies by one fp32 scale (fp8's per-tensor product)."""
    BLOCK_T: gl.constexpr = c_desc.block_type.shape[0]
    BLOCK_W: gl.constexpr = c_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = x_desc.block_type.shape[1]
    pid = gl.program_id(0)
    if CLOCKS:
        start_ns = _now(pid, True)
    k_steps = gl.cdiv(x_desc.shape[1], BLOCK_K)
    num_pid_t = gl.cdiv(c_desc.shape[0], BLOCK_T)
    off_w = (pid // num_pid_t) * BLOCK_W
    off_t = (pid % num_pid_t) * BLOCK_T

    c_smem = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)
    warm = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    if EPILOGUE == 2:  # touch C's descriptor now, so the store at the end finds it cached
        init_barriers(warm, 1)
        mbarrier.expect(warm.index(0), c_desc.block_type.nbytes)
        tma_load(c_desc, [off_t, off_w], warm.index(0), c_smem)

    x_bufs = gl.allocate_shared_memory(x_desc.dtype, [STAGES] + x_desc.block_type.shape, x_desc.layout)
    w_bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES] + w_desc.block_type.shape, w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    init_barriers(ready, STAGES)
    for s in gl.static_range(STAGES - 1):
        load_step(
            x_desc, w_desc, off_t, off_w, s * BLOCK_K, ready.index(s), x_bufs.index(s), w_bufs.index(s),
            True, pred=s < k_steps,
        )  # fmt: skip
    mma = MMA.initialize(x_desc.dtype, BLOCK_W, BLOCK_T, gl.num_warps())
    first_ns = pid.to(gl.int64) * 0
    for k in range(k_steps):
        ring = Ring(k, STAGES)
        ring.wait_filled(ready)
        if CLOCKS:  # noqa: SIM102 (a constexpr test, then a runtime one)
            if k == 0:
                first_ns = _now(k, True)
        slot = ring.slot()
        w_op, x_op = swapab.swapped_operands(x_bufs.index(slot), w_bufs.index(slot), True)
        mma = mma.issue(w_op, x_op)
        mma = mma.wait(1)
        nxt = k + STAGES - 1
        refill = Ring(nxt, STAGES).slot()
        load_step(
            x_desc, w_desc, off_t, off_w, nxt * BLOCK_K, ready.index(refill), x_bufs.index(refill),
            w_bufs.index(refill), True, pred=nxt < k_steps,
        )  # fmt: skip
    acc, mma = mma.take_result()
    invalidate_barriers(ready, STAGES)
    if CLOCKS:
        last_ns = _now(k_steps, True)
    if SCALED:
        acc = acc * gl.load(scale)
    if EPILOGUE == 2:
        mbarrier.wait(warm.index(0), 0)
    if write != 0:
        if EPILOGUE == 1:
            store_sum(c_desc, acc.permute((1, 0)), off_t, off_w, 0, 0, 0)
        elif EPILOGUE == 2:
            store_tile(c_desc, c_smem, acc.permute((1, 0)), off_t, off_w)
            tma.store_wait(0)
        else:  # 3 (and 0, whose launches pass write = 0): C[t, w] from the [BLOCK_W, BLOCK_T] accumulator
            layout: gl.constexpr = acc.type.layout
            rows = off_w + gl.arange(0, BLOCK_W, layout=gl.SliceLayout(1, layout))
            cols = off_t + gl.arange(0, BLOCK_T, layout=gl.SliceLayout(0, layout))
            ptrs = c_ptr + gl.expand_dims(cols, 0) * c_desc.shape[1] + gl.expand_dims(rows, 1)
            mask = gl.expand_dims(cols < c_desc.shape[0], 0) & gl.expand_dims(rows < c_desc.shape[1], 1)
            gl.store(ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)
    if CLOCKS:
        end_ns = _now(k_steps + 1, True)
        base = clocks + pid * 4
        gl.store(base, start_ns)
        gl.store(base + 1, first_ns)
        gl.store(base + 2, last_ns)
        gl.store(base + 3, end_ns)


def probe_call(
    a, b, scale, ring: tuple[int, int], epilogue: int, clocks: torch.Tensor | None = None, write: int = 1
):
    """The probe over a @ b (b the transpose view of an [N, K] weight) with swapab's whole-K tile at
    this M, its ring replaced by `ring` (K step in bytes, stages)."""
    target = target_of(a.device)
    M, N = a.shape[0], b.shape[1]
    fp8 = a.element_size() == 1
    step_bytes, stages = ring
    cfg = swapab.whole_k(target.capability, M, fp8)
    cfg = replace(cfg, BLOCK_K=step_bytes // a.element_size(), STAGES=stages)
    out = torch.full((M, N), float("nan"), device=a.device, dtype=torch.bfloat16 if fp8 else a.dtype)
    descs = make_descriptors(a, b, out, cfg, "t", swapab._blocks(cfg, "t"))
    grid = (triton.cdiv(N, cfg.BLOCK_M) * triton.cdiv(M, cfg.BLOCK_N),)
    buf = clocks if clocks is not None else torch.empty(1, device=a.device, dtype=torch.int64)
    flags = {"MMA": select_mma(target.capability), "STAGES": stages, "EPILOGUE": epilogue}
    flags |= {"SCALED": scale is not None, "CLOCKS": clocks is not None}
    scale_arg = scale if scale is not None else buf

    def fn():
        probe_kernel[grid](*descs, out, scale_arg, buf, write, **flags, num_warps=cfg.num_warps)
        return out

    return fn, grid[0]


def summary(clk: torch.Tensor) -> dict[str, float]:
    """Medians and spreads of one clocked launch, µs from the earliest start."""
    c = clk.view(-1, 4).double().cpu()
    t0 = c[:, 0].min()
    start, first, last, end = ((c[:, i] - t0) / 1e3 for i in range(4))
    return {
        "start_max": start.max().item(),
        "first_p50": first.median().item(), "first_max": first.max().item(),
        "last_min": last.min().item(), "last_p50": last.median().item(), "last_max": last.max().item(),
        "epilogue_p50": (end - last).median().item(),
        "end_p50": end.median().item(), "end_max": end.max().item(),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = probe_parser(__doc__).parse_args(argv)
    flush, sink = flush_buffers()
    rows, clock_rows = [], []
    for M, N, K, dtype in SHAPES:
        a, b, scales = operands(Shape(M, N, K), dtype, "tensor")
        fp8 = dtype == "fp8"
        scale = (scales["scale_a"] * scales["scale_b"]).float().reshape(1) if fp8 else None
        moved = a.numel() * a.element_size() + b.numel() * b.element_size() + M * N * 2
        default = swapab.whole_k((9, 0), M, fp8)
        package_ring = (default.BLOCK_K * a.element_size(), default.STAGES)
        variants = {
            "read": call_of("read", a, b, {}, moved)[0],
            "swapab whole-K": call_of(
                f"swapab@BLOCK_M=64:BLOCK_N={default.BLOCK_N}:BLOCK_K={default.BLOCK_K}"
                f":STAGES={default.STAGES}:SPLIT_K=1",
                a, b, scales, None,
            )[0],
        }  # fmt: skip
        for epi, name in EPILOGUES.items():
            fn = probe_call(a, b, scale, package_ring, epi, write=int(epi != 0))[0]
            variants[f"probe {package_ring} {name}"] = fn
        for ring in RINGS if M <= 16 else [package_ring]:
            if ring != package_ring:
                variants[f"probe {ring} tma"] = probe_call(a, b, scale, ring, 1)[0]
            if not fp8:  # the ring alone, 64-row boxes, one program per tile
                step, stages = ring
                variants[f"ring alone {ring}"] = stream_call(b.t(), 64, step // 2, stages, 0)
        ref = (a.float() @ b.float()) * (scale.item() if fp8 else 1.0)
        for name, fn in variants.items():
            if name.startswith("probe") and not name.endswith("none"):
                check_close(f"{name} at {M}x{N}x{K} {dtype}", fn(), ref, 2e-2)
            times = timed(fn, args.reps, flush, sink)[1]
            record(rows, {"M": M, "N": N, "K": K, "dtype": dtype, "variant": name, **times})
        for epi, name in EPILOGUES.items():
            programs = triton.cdiv(N, 64) * triton.cdiv(M, default.BLOCK_N)
            clk = torch.zeros(programs * 4, device="cuda", dtype=torch.int64)
            fn, _ = probe_call(a, b, scale, package_ring, epi, clk, write=int(epi != 0))
            for _ in range(3):  # the last of three launches, each after an L2 flush
                flush.sum()
                fn()
            torch.cuda.synchronize()
            row = {"M": M, "N": N, "K": K, "dtype": dtype, "epilogue": name, "programs": programs}
            row |= {k: round(v, 3) for k, v in summary(clk).items()}
            clock_rows.append(row)
            print(row, flush=True)
    write_csv(args.output, rows)
    write_csv(args.output.replace(".csv", "-clocks.csv"), clock_rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
