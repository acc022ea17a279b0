"""swapab's whole-K tile with fewer weight rows than the wgmma's 64, for more programs (perf-notes 39-43).

A 4096-wide weight is 64 whole-K tiles of 64 rows: 64 programs on the H100's 132 SMs, so half
the SMs pull the whole weight. The wgmma cannot be shorter than 64 rows, but the tile it reads
need not be full: the weight is viewed as [N / ROWS, ROWS, K] and each K step TMA-loads a
[1, 64, BLOCK_K] box of it, whose rows past ROWS are outside the view, so the TMA fetches
nothing for them and fills them with zeros in shared memory. The MMA multiplies 64 rows (the
zero ones are free beside the stream) and the epilogue stores the first ROWS. At ROWS = 32 a
4096-wide weight is 128 programs; at 48 a 6144-wide one is. Kernel-only (CUPTI, cold L2:
scripts/kernel_time.py's clock), against the package's whole-K tile, `auto`, a plain-Triton
read of the same bytes and (16-bit) the rings alone with 64- and 32-row boxes.

Not part of the package: an experiment, run on the GPU with

    PYTHONPATH=src python3 scripts/narrow_probe.py --output $OUT/narrow-probe.csv
    PYTHONPATH=src python3 scripts/narrow_probe.py --parts --output $OUT/narrow-parts.csv
    PYTHONPATH=src python3 scripts/narrow_probe.py --prefetch --output $OUT/prefetch.csv
    PYTHONPATH=src python3 scripts/narrow_probe.py --chains --output $OUT/chains.csv
    PYTHONPATH=src python3 scripts/narrow_probe.py --sub --output $OUT/sub.csv
    PYTHONPATH=src python3 scripts/narrow_probe.py --tail --output $OUT/tail.csv

--prefetch (perf-notes 40): the 64-row tile and its ring alone, each program first asking L2 for
its whole weight slice (PREFETCH 1: one `cp.async.bulk.prefetch.L2` per K step of each row, 2:
one `prefetch.global.L2` per 128-byte line), in the order the ring will consume it, so that HBM
streams the whole weight from the first microsecond instead of at the ring's depth.

--chains (perf-notes 41): the tile with each K step's MMAs split over two accumulators (CHAINS
2: the first and second half of the step, two dependent chains half as long), against one, and
without MMAs (the ceiling of any consumer on this ring).

--sub (perf-notes 42): the tile with each stage's K cut into SUB boxes, each on its own barrier,
so that a box's MMAs go out as soon as it lands and only the last box's trail the last byte;
against SUB 1, a ring of FINE times as many stages FINE times narrower (each box refilled on its
own), and without MMAs; at 16 tokens also the 64-row tile on one stage more (entry 38's ring).

--tail (perf-notes 43): the tile with its MMAs on every stage, on all but the last, on the last
only and on none: what the MMAs that follow the last byte cost, against what the others do.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

sys.path.insert(0, str(Path(__file__).parent))
from kernel_time import call_of, check_close, flush_buffers, operands, probe_parser, record, timed, write_csv
from slab_probe import stream_call

from gluon_survey.api import target_of
from gluon_survey.compat import tma_load
from gluon_survey.driver.shapes import Shape
from gluon_survey.kernels import swapab
from gluon_survey.kernels.arch import select_mma
from gluon_survey.kernels.common import Ring, init_barriers, invalidate_barriers
from gluon_survey.kernels.plan import gl_dtype, smem_layout

MMA_ROWS = 64  # the wgmma's M
# (M, N, K, dtype): the 16-bit misses at M = 16 and 64, and fp8's (per-tensor scale) 4096 x 14336
SHAPES = [
    (16, 4096, 4096, "bf16"),
    (64, 4096, 4096, "bf16"),
    (16, 6144, 4096, "bf16"),
    (64, 6144, 4096, "bf16"),
    (16, 4096, 14336, "fp8"),
    (64, 4096, 14336, "fp8"),
]
# token tile -> rings (K step in bytes, stages) to try; a stage holds 64 weight rows whatever ROWS
RINGS = {16: [(512, 4), (512, 5), (256, 8)], 64: [(256, 6), (128, 12)]}
# --prefetch: what each program asks L2 for at its start (PREFETCH): nothing, a bulk prefetch per
# (row, K step), a line prefetch per 128 bytes
PREFETCHES = {"none": 0, "bulk": 1, "lines": 2}
LINE = 128
# --sub: boxes a stage's K is cut into, each with its own barrier (SUB); against a ring of FINE
# times as many stages, FINE times narrower (the same bytes, each box refilled on its own)
SUBS = (1, 2, 4)
FINE = 4
# --tail: which stages' MMAs the tile issues (MULTIPLY): all, all but the last, the last only, none
TAILS = {"full": 1, "all-but-last": 2, "last-only": 3, "no-mma": 0}
# --parts: the tile whole, without its token loads, without its MMAs, without both (TOKENS, MULTIPLY)
PARTS = {"full": (True, True), "no-tokens": (False, True), "no-mma": (True, False), "neither": (False, False)}


@gluon.jit
def prefetch_l2(w_bytes, first_row, row_bytes, ROWS: gl.constexpr, PIECE: gl.constexpr,
                PIECES: gl.constexpr, KIND: gl.constexpr):  # fmt: skip
    """Ask L2 for rows [first_row, first_row + ROWS) of the weight (row_bytes each, contiguous) in
    the ring's order: piece q is bytes [c PIECE, (c + 1) PIECE) of row q % ROWS, c = q // ROWS, and
    thread t issues pieces t, t + threads, ... so the program's requests go out K step by K step.
    KIND 1: cp.async.bulk.prefetch.L2 (the TMA unit), 2: prefetch.global.L2 (PIECE = one line)."""
    threads: gl.constexpr = 32 * gl.num_warps()
    per_thread: gl.constexpr = PIECES // threads
    layout: gl.constexpr = gl.BlockedLayout([per_thread, 1], [1, 32], [1, gl.num_warps()], [0, 1])
    j = gl.arange(0, per_thread, layout=gl.SliceLayout(1, layout))
    t = gl.arange(0, threads, layout=gl.SliceLayout(0, layout))
    q = gl.expand_dims(j, 1) * threads + gl.expand_dims(t, 0)
    start = (q // ROWS) * PIECE
    offset = (first_row + q % ROWS).to(gl.int64) * row_bytes + start
    valid = (start < row_bytes).to(gl.int32)
    ptrs = w_bytes + offset
    if KIND == 1:
        asm: gl.constexpr = "@p cp.async.bulk.prefetch.L2.global [$1], $3; mov.b32 $0, 0; }"
    else:
        asm: gl.constexpr = "@p prefetch.global.L2 [$1]; mov.b32 $0, $3; }"
    guard: gl.constexpr = "{ .reg .pred p; setp.ne.b32 p, $2, 0; "
    size = gl.full(q.shape, PIECE, gl.int32, layout)
    args = [ptrs, valid, size]
    return gl.inline_asm_elementwise(guard + asm, "=r,l,r,r", args, dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def load_stage(x_desc, w_desc, ready, x_bufs, w_bufs, slot, step, off_t, group, pred,
               TOKENS: gl.constexpr, SUB: gl.constexpr):  # fmt: skip
    """K step `step` into stage `slot`: SUB boxes of BLOCK_K (token box and weight box), box j to
    buffer and barrier slot * SUB + j."""
    BLOCK_K: gl.constexpr = x_desc.block_type.shape[1]
    nbytes: gl.constexpr = x_desc.block_type.nbytes * TOKENS + w_desc.block_type.nbytes
    for j in gl.static_range(SUB):
        box = slot * SUB + j
        k = (step * SUB + j) * BLOCK_K
        mbarrier.expect(ready.index(box), nbytes, pred)
        if TOKENS:
            tma_load(x_desc, [off_t, k], ready.index(box), x_bufs.index(box), pred)
        tma_load(w_desc, [group, 0, k], ready.index(box), w_bufs.index(box), pred)


@gluon.jit
def narrow_kernel(
    x_desc, w_desc, c_ptr, M, N, scale, w_bytes,
    MMA: gl.constexpr, ROWS: gl.constexpr, STAGES: gl.constexpr, SCALED: gl.constexpr,
    TOKENS: gl.constexpr = True, MULTIPLY: gl.constexpr = True,
    PREFETCH: gl.constexpr = 0, PIECE: gl.constexpr = 0, PIECES: gl.constexpr = 0, CHAINS: gl.constexpr = 1,
    SUB: gl.constexpr = 1,
):  # fmt: skip
    """C[t, w] for the ROWS weight rows of program // (M's token tiles) and one token tile, all of
    K, through a ring of STAGES stages (pipelined.ring_mma's loop); w_desc views the weight as
    [N / ROWS, ROWS, K] with [1, 64, BLOCK_K] boxes. Parts off, for the second run: TOKENS = False
    loads no token box (the MMA reads whatever the stage holds), MULTIPLY = False issues no MMA
    (C is stored as zeros); MULTIPLY 2 or 3 issues every stage's MMAs but the last's, or only the
    last's (C is then wrong). PREFETCH 1 or 2: `prefetch_l2` of the program's ROWS rows first. CHAINS 2:
    each box's MMAs on two accumulators, a half of the box each, summed at the end. SUB: a stage
    is SUB boxes of BLOCK_K (the descriptors' box), each on its own barrier and multiplied as soon
    as it lands; the ring refills a stage's SUB boxes together once its MMAs have retired."""
    BLOCK_T: gl.constexpr = x_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = x_desc.block_type.shape[1]
    BLOCK_W: gl.constexpr = w_desc.block_type.shape[1]
    # the waits below retire SUB * CHAINS groups a stage: the tail probe issues one chain only
    gl.static_assert(MULTIPLY < 2 or CHAINS == 1, "MULTIPLY 2 and 3 are for one chain")
    pid = gl.program_id(0)
    num_pid_t = gl.cdiv(M, BLOCK_T)
    group = pid // num_pid_t
    off_t = (pid % num_pid_t) * BLOCK_T
    if PREFETCH:
        prefetch_l2(w_bytes, group * ROWS, x_desc.shape[1] * w_desc.dtype.primitive_bitwidth // 8,
                    ROWS, PIECE, PIECES, PREFETCH)  # fmt: skip

    x_bufs = gl.allocate_shared_memory(x_desc.dtype, [STAGES * SUB] + x_desc.block_type.shape, x_desc.layout)
    w_bufs = gl.allocate_shared_memory(w_desc.dtype, [STAGES * SUB] + w_desc.block_type.shape, w_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES * SUB, 1], mbarrier.MBarrierLayout())
    init_barriers(ready, STAGES * SUB)
    STEP_K: gl.constexpr = BLOCK_K * SUB  # a stage's K: SUB boxes of BLOCK_K, each on its own barrier
    k_steps = gl.cdiv(x_desc.shape[1], STEP_K)
    for s in gl.static_range(STAGES - 1):
        load_stage(x_desc, w_desc, ready, x_bufs, w_bufs, s, s, off_t, group, s < k_steps, TOKENS, SUB)
    mma = MMA.initialize(x_desc.dtype, BLOCK_W, BLOCK_T, gl.num_warps())
    mma2 = MMA.initialize(x_desc.dtype, BLOCK_W, BLOCK_T, gl.num_warps())
    for k in range(k_steps):
        ring = Ring(k, STAGES)
        slot = ring.slot()
        for j in gl.static_range(SUB):  # each box's MMAs go out as soon as that box has landed
            box = slot * SUB + j
            mbarrier.wait(ready.index(box), ring.phase())
            w_tile = w_bufs.index(box).reshape([BLOCK_W, BLOCK_K])
            x_tile = x_bufs.index(box)
            if MULTIPLY == 1 and CHAINS == 1:
                w_op, x_op = swapab.swapped_operands(x_tile, w_tile, True)
                mma = mma.issue(w_op, x_op)
            elif MULTIPLY >= 2:  # the tail probe: every stage's MMAs but the last's (2), or only its (3)
                if (k == k_steps - 1) == (MULTIPLY == 3):
                    w_op, x_op = swapab.swapped_operands(x_tile, w_tile, True)
                    mma = mma.issue(w_op, x_op)
            elif MULTIPLY:  # the box's two halves of K on two accumulators: two chains half as long
                HALF: gl.constexpr = BLOCK_K // 2
                w_op, x_op = swapab.swapped_operands(x_tile.slice(0, HALF, 1), w_tile.slice(0, HALF, 1), True)
                mma = mma.issue(w_op, x_op)
                x_half = x_tile.slice(HALF, HALF, 1)
                w_op, x_op = swapab.swapped_operands(x_half, w_tile.slice(HALF, HALF, 1), True)
                mma2 = mma2.issue(w_op, x_op)
        if MULTIPLY:  # retire the previous stage's MMAs, whose stage is the one refilled next
            mma = mma.wait(SUB * CHAINS)
            if CHAINS == 2:
                mma2 = mma2.wait(SUB * CHAINS)
        nxt = k + STAGES - 1
        refill = Ring(nxt, STAGES).slot()
        load_stage(
            x_desc, w_desc, ready, x_bufs, w_bufs, refill, nxt, off_t, group, nxt < k_steps, TOKENS, SUB
        )
    acc, mma = mma.take_result()
    if CHAINS == 2:
        acc2, mma2 = mma2.take_result()
        acc = acc + acc2
    invalidate_barriers(ready, STAGES * SUB)
    if SCALED:
        acc = acc * gl.load(scale)
    # C[t, w] from the [64, BLOCK_T] accumulator's first ROWS rows, straight from registers
    layout: gl.constexpr = acc.type.layout
    local = gl.arange(0, BLOCK_W, layout=gl.SliceLayout(1, layout))
    rows = group * ROWS + local
    cols = off_t + gl.arange(0, BLOCK_T, layout=gl.SliceLayout(0, layout))
    ptrs = c_ptr + gl.expand_dims(cols, 0) * N + gl.expand_dims(rows, 1)
    mask = gl.expand_dims(cols < M, 0) & gl.expand_dims((local < ROWS) & (rows < N), 1)
    gl.store(ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


def narrow_call(
    a, b, scale, rows: int, ring: tuple[int, int], tokens: bool = True, multiply: int = 1,
    prefetch: int = 0, chains: int = 1, sub: int = 1,
):  # fmt: skip
    """The probe over a @ b (b the transpose view of an [N, K] weight, N a multiple of `rows`)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    target = target_of(a.device)
    M, K = a.shape
    N = b.shape[1]
    w = b.t()
    step_bytes, stages = ring
    block_k = step_bytes // a.element_size() // sub  # a box's K: the stage's K over SUB
    cfg = swapab.whole_k(target.capability, M, a.element_size() == 1)
    x_block = [cfg.BLOCK_N, block_k]
    w_block = [1, MMA_ROWS, block_k]
    x_desc = TensorDescriptor.from_tensor(a, x_block, smem_layout(x_block, gl_dtype(a)))
    w_desc = TensorDescriptor(
        w, [N // rows, rows, K], [rows * K, K, 1], w_block, smem_layout(w_block, gl_dtype(w))
    )
    out = torch.full(
        (M, N), float("nan"), device=a.device, dtype=torch.bfloat16 if scale is not None else a.dtype
    )
    grid = (N // rows * triton.cdiv(M, cfg.BLOCK_N),)
    flags = {
        "MMA": select_mma(target.capability),
        "ROWS": rows,
        "STAGES": stages,
        "SCALED": scale is not None,
        "TOKENS": tokens,
        "MULTIPLY": multiply,
        "PREFETCH": prefetch,
        "CHAINS": chains,
        "SUB": sub,
    }
    if prefetch:  # pieces a program asks for, rounded up to a power of two a thread (an arange)
        piece = step_bytes if prefetch == 1 else LINE
        threads = 32 * cfg.num_warps
        per_thread = triton.cdiv(rows * triton.cdiv(K * a.element_size(), piece), threads)
        flags |= {"PIECE": piece, "PIECES": threads * triton.next_power_of_2(per_thread)}
    w_bytes = w.view(torch.uint8)
    scale_arg = scale if scale is not None else out

    def fn():
        narrow_kernel[grid](x_desc, w_desc, out, M, N, scale_arg, w_bytes, **flags, num_warps=cfg.num_warps)
        return out

    return fn


def main(argv: list[str] | None = None) -> int:
    parser = probe_parser(__doc__)
    mode = parser.add_mutually_exclusive_group()  # one probe a call; two are refused, not half-run
    mode.add_argument("--parts", action="store_true", help="M = 16 only: the tile with parts of it off")
    mode.add_argument(
        "--prefetch", action="store_true", help="the 64-row tile and its ring, L2 prefetch or not"
    )
    mode.add_argument(
        "--chains", action="store_true", help="the tile (64 and narrow rows) on one or two accumulators"
    )
    mode.add_argument(
        "--tail",
        action="store_true",
        help="the tile with MMAs on all, all but the last, the last or no stage",
    )
    mode.add_argument(
        "--sub", action="store_true", help="the tile with each stage's boxes on 1, 2 or 4 barriers"
    )
    args = parser.parse_args(argv)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    flush, sink = flush_buffers()
    rows_out = []
    for M, N, K, dtype in SHAPES:
        if args.parts and M != 16:
            continue
        a, b, scales = operands(Shape(M, N, K), dtype, "tensor")
        fp8 = dtype == "fp8"
        scale = (scales["scale_a"] * scales["scale_b"]).float().reshape(1) if fp8 else None
        moved = a.numel() * a.element_size() + b.numel() * b.element_size() + M * N * 2
        default = swapab.whole_k((9, 0), M, fp8)
        package_ring = (default.BLOCK_K * a.element_size(), default.STAGES)
        variants = {"read": call_of("read", a, b, {}, moved)[0]}
        narrow = [r for r in (32, 48) if N % r == 0 and N // r <= sms]
        if not args.parts:
            variants["auto"] = call_of("auto", a, b, scales, None)[0]
        if args.tail:  # what the last stage's MMAs cost: the tile with and without them, and them alone
            for rows in [64, *narrow]:
                for name, multiply in TAILS.items():
                    fn = narrow_call(a, b, scale, rows, package_ring, True, multiply)
                    variants[f"tile {rows} rows {name}"] = fn
        elif args.sub:  # a stage's K in SUB boxes on their own barriers; the same bytes as SUB stages
            for rows in [64, *narrow]:
                for sub in SUBS:
                    tile = narrow_call(a, b, scale, rows, package_ring, sub=sub)
                    variants[f"tile {rows} rows sub {sub}"] = tile
                fine = (package_ring[0] // FINE, package_ring[1] * FINE)
                variants[f"tile {rows} rows ring {fine}"] = narrow_call(a, b, scale, rows, fine)
                no_mma = narrow_call(a, b, scale, rows, package_ring, True, False)
                variants[f"tile {rows} rows no-mma"] = no_mma
            if default.BLOCK_N == 16:  # the deeper ring of entry 38 (a 16-token stage fits five times)
                deeper = (package_ring[0], package_ring[1] + 1)
                for sub in (1, SUBS[-1]):
                    tile = narrow_call(a, b, scale, 64, deeper, sub=sub)
                    variants[f"tile 64 rows ring {deeper} sub {sub}"] = tile
        elif args.chains:  # the tile on one and on two accumulator chains, and without its MMAs
            for rows in [64, *narrow]:
                for chains in (1, 2):
                    fn = narrow_call(a, b, scale, rows, package_ring, chains=chains)
                    variants[f"tile {rows} rows {chains} chains"] = fn
                no_mma = narrow_call(a, b, scale, rows, package_ring, True, False)
                variants[f"tile {rows} rows no-mma"] = no_mma
        elif args.prefetch:  # the 64-row tile and its ring alone, each with and without the prefetch
            for name, kind in PREFETCHES.items():
                variants[f"tile prefetch {name}"] = narrow_call(a, b, scale, 64, package_ring, prefetch=kind)
                ring_alone = narrow_call(a, b, scale, 64, package_ring, False, False, kind)
                variants[f"ring alone prefetch {name}"] = ring_alone
        elif args.parts:  # the tile (64 rows, and the narrow one) with its parts off, the package's ring
            for rows in [64, *narrow]:
                for part, (tokens, multiply) in PARTS.items():
                    fn = narrow_call(a, b, scale, rows, package_ring, tokens, multiply)
                    variants[f"narrow {rows} rows {package_ring} {part}"] = fn
        else:
            variants[f"whole-K 64 rows {package_ring}"] = call_of(
                f"swapab@BLOCK_M=64:BLOCK_N={default.BLOCK_N}:BLOCK_K={default.BLOCK_K}"
                f":STAGES={default.STAGES}:SPLIT_K=1",
                a, b, scales, None,
            )[0]  # fmt: skip
            for rows in narrow:
                for ring in RINGS[default.BLOCK_N]:
                    variants[f"narrow {rows} rows {ring}"] = narrow_call(a, b, scale, rows, ring)
        alone = not (fp8 or args.prefetch or args.chains or args.sub or args.tail)
        if alone:  # the rings alone (no consumer), 64- and 32-row boxes
            step, stages = package_ring
            variants[f"ring alone 64 rows {package_ring}"] = stream_call(b.t(), 64, step // 2, stages, 0)
            variants[f"ring alone 32 rows {package_ring}"] = stream_call(b.t(), 32, step // 2, stages, 0)
        ref = (a.float() @ b.float()) * (scale.item() if fp8 else 1.0)
        for name, fn in variants.items():
            if name.startswith(("narrow", "tile")) and not name.endswith(
                ("no-tokens", "no-mma", "neither", "but-last", "last-only")
            ):
                check_close(f"{name} at {M}x{N}x{K} {dtype}", fn(), ref, 2e-2)
            med, times = timed(fn, args.reps, flush, sink)
            row = {"M": M, "N": N, "K": K, "dtype": dtype, "variant": name, **times}
            record(rows_out, row | {"gbps": round(moved / med / 1e3, 1)})
    write_csv(args.output, rows_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
