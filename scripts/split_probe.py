"""What a GEMM in small programs costs at M <= 64: the ceiling of split-K over the fastest reads
(docs/perf-notes.md, entry 52).

Entry 31 found a read of a 4096 x 4096 bf16 weight in programs of 4 KB (12.03 µs) under the
12.46 µs that 0.90 of rung 0 allows at 16 x 4096 x 4096, where every TMA ring measured is over
it. A read that fast is thousands of small programs, each a few KB; a GEMM shaped like it cuts K
(a program of R weight rows by KC columns), so each program also reads the tokens' [M, KC] piece
and leaves an [M, R] partial that something must sum. This times, kernel-only (CUPTI, cold L2:
kernel_time's clock), per program shape (R, KC, warps) on the decode weights that miss:

- `read`: the weight's [R, KC] block alone (one float a row out): the program shape's read;
- `ceiling`: the block, the tokens' piece and the [M, R] fp32 partial stored, with no multiply:
  what any split-K kernel of this program shape costs before its multiplies and its sum;
- `atomic`: the same, the partial added into one [M, N] fp32 buffer (`red.add` in L2) instead
  of stored: the atomic form's ceiling, without the zeroing and the conversion it also needs;
- `gemm`: a whole split-K GEMM of this shape (tl.dot on the block, the partials stored, a second
  kernel summing them into C), checked against an fp32 reference with C poisoned with NaN;

beside kernel_time's read of the GEMM's bytes, the 4 KB read and `auto`, all in one call.

Not part of the package: an experiment, run on the GPU with

    PYTHONPATH=src python3 scripts/split_probe.py --output $OUT/split-probe.csv
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).parent))
from kernel_time import (
    against_rung0,
    call_of,
    check_close,
    flush_buffers,
    operands,
    probe_parser,
    record,
    stream_read,
    timed,
    write_csv,
)

from gluon_survey.driver.shapes import Shape

SHAPES = [(16, 4096, 4096), (64, 4096, 4096), (16, 6144, 4096), (64, 6144, 4096)]
# (R, KC, warps): programs of 4, 8, 16, 32 and 64 KB of bf16 weight.
PROGRAMS = [
    (16, 128, 4), (32, 64, 4), (64, 32, 4),
    (32, 128, 4), (64, 64, 4),
    (64, 128, 4), (32, 256, 4), (128, 64, 8),
    (64, 256, 8), (128, 128, 8),
    (64, 512, 8),
]  # fmt: skip
VARIANTS = {"read": 0, "ceiling": 1, "atomic": 2, "gemm": 3}


@triton.jit
def split_part(w, a, ws, N, K, M: tl.constexpr, R: tl.constexpr, KC: tl.constexpr, WHAT: tl.constexpr):
    """Program (n, s) reads W[nR:(n+1)R, sKC:(s+1)KC] of the [N, K] weight (and for WHAT > 0 the
    tokens' A[:, sKC:(s+1)KC]) and leaves what VARIANTS names in ws ([K / KC, M, N] fp32, or
    [M, N] for `atomic`)."""
    pid_s = tl.program_id(1)
    rows = tl.program_id(0) * R + tl.arange(0, R)
    cols = pid_s * KC + tl.arange(0, KC)
    wt = tl.load(
        w + rows[:, None] * K + cols[None, :], mask=(rows[:, None] < N) & (cols[None, :] < K), other=0.0
    )
    if WHAT == 0:
        tl.store(ws + pid_s * N + rows, tl.sum(wt.to(tl.float32), axis=1), mask=rows < N)
    else:
        tok = tl.arange(0, M)
        at = tl.load(a + tok[:, None] * K + cols[None, :], mask=cols[None, :] < K, other=0.0)
        if WHAT == 3:
            part = tl.dot(wt, tl.trans(at))  # [R, M]: the weight rows as the MMA's M (swap-AB)
        else:
            part = tl.sum(wt.to(tl.float32), axis=1)[:, None] * tl.sum(at.to(tl.float32), axis=1)[None, :]
        offs = tok[None, :] * N + rows[:, None]
        if WHAT == 2:
            tl.atomic_add(ws + offs, part, mask=rows[:, None] < N, sem="relaxed")
        else:
            tl.store(ws + pid_s * M * N + offs, part, mask=rows[:, None] < N)


@triton.jit
def split_sum(ws, c, MN, S, SB: tl.constexpr, BLOCK: tl.constexpr):
    """C[i] = sum over s of ws[s, i], SB slices a load, for BLOCK elements of C a program."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for s0 in range(0, S, SB):
        sl = s0 + tl.arange(0, SB)
        acc += tl.sum(tl.load(ws + sl[:, None] * MN + offs[None, :], mask=sl[:, None] < S, other=0.0), axis=0)
    tl.store(c + offs, acc.to(c.dtype.element_ty), mask=offs < MN)


def call(variant: str, a, w, c, R: int, KC: int, warps: int):
    """The timed call of one variant; returns it and the split count."""
    M, K = a.shape
    N = w.shape[0]
    S = triton.cdiv(K, KC)
    grid = (triton.cdiv(N, R), S)
    what = VARIANTS[variant]
    ws = torch.zeros((S, N) if what == 0 else (M, N) if what == 2 else (S, M, N), device="cuda")

    def part():
        split_part[grid](w, a, ws, N, K, M=M, R=R, KC=KC, WHAT=what, num_warps=warps)

    if what != 3:
        return part, S
    block = 256

    def gemm():
        part()
        split_sum[(triton.cdiv(M * N, block),)](ws, c, M * N, S, SB=8, BLOCK=block, num_warps=4)

    return gemm, S


def read_4k(nbytes: int):
    """Entry 31's fastest read of `nbytes`: programs of 4 KB (2,048 fp16), 4 warps."""
    src = torch.randn(nbytes // 2, device="cuda", dtype=torch.float16)
    dst = torch.empty(triton.cdiv(src.numel(), 2048), device="cuda")
    return lambda: stream_read[(dst.numel(),)](src, dst, src.numel(), BLOCK=2048)


def main(argv: list[str] | None = None) -> int:
    args = probe_parser(__doc__).parse_args(argv)
    flush, sink = flush_buffers()
    rows = []
    for M, N, K in SHAPES:
        a, b, _ = operands(Shape(M, N, K), "bf16", "tensor")
        w = b.t()  # the [N, K] weight, contiguous
        nbytes = (M * K + N * K + M * N) * 2
        ref = a.float() @ b.float()
        refs = {
            "read 16KB (kernel_time)": call_of("read", a, b, {}, nbytes)[0],
            "read 4KB (entry 31)": read_4k(nbytes),
            "auto": call_of("auto", a, b, {}, nbytes)[0],
        }
        cases = [(name, fn, "", 0) for name, fn in refs.items()]
        for R, KC, warps in PROGRAMS:
            for variant in VARIANTS:
                c = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
                fn, S = call(variant, a, w, c, R, KC, warps)
                if variant == "gemm":
                    fn()
                    check_close(f"gemm {R}x{KC} w{warps} at {M}x{N}x{K}", c, ref, 2e-2)
                cases.append((variant, fn, f"{R}x{KC} w{warps}", S))
        for variant, fn, program, S in cases:
            med, times = timed(fn, args.reps, flush, sink)
            row = {"M": M, "N": N, "K": K, "variant": variant, "program": program, "splits": S, **times,
                   **against_rung0(nbytes, med)}  # fmt: skip
            record(rows, row)
    write_csv(args.output, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
