"""How fast can an H100 read N bytes at all? The floor under the target "M <= 64 at >= 0.90 of
rung 0's bandwidth" on the small weights (docs/perf-notes.md, entry 31).

Rung 0's 3,015 GB/s is measured on 1 GiB copies, where a kernel's fixed costs (the launch, the
first bytes' latency from HBM, the tail of the last wave) vanish. A 4096 x 4096 weight is 32 MiB:
at 3,015 GB/s its bytes take 11.1 µs, and 0.90 of that rate leaves 1.2 µs for everything else.
kernel_time's `read` (2,048 programs of 16 KB) takes 12.3 µs there. This asks whether any read
does better: kernel_time's read over other block sizes and warps, persistent grids
(a few programs an SM, each walking the buffer with its next chunk's loads in flight), and an
empty launch of as many programs (the fixed cost alone), each timed kernel-only (CUPTI, cold L2:
kernel_time's clock), on buffers the size of the decode weights' bytes in bf16 and in fp8.

Not part of the package: an experiment, run on the GPU with

    PYTHONPATH=src python3 scripts/read_floor.py --output $OUT/read-floor.csv
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).parent))
from kernel_time import against_rung0, flush_buffers, probe_parser, record, stream_read, timed, write_csv

# Bytes of A, W and C at M = 1 for the decode weights' (N, K), 2-byte and 1-byte weights.
WEIGHTS = [(4096, 4096), (6144, 4096), (4096, 14336), (8192, 8192), (10240, 8192), (28672, 4096)]


@triton.jit
def persistent_read(src, dst, n, BLOCK: tl.constexpr):
    """Program p reads chunks p, p + G, ...; chunk i + G's loads go out before chunk i is summed."""
    g = tl.num_programs(0)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    nxt = tl.load(src + offs, mask=offs < n, other=0.0)
    acc = tl.zeros([BLOCK], tl.float32)
    for _ in range(tl.program_id(0), tl.cdiv(n, BLOCK), g):
        cur = nxt
        offs += g * BLOCK
        nxt = tl.load(src + offs, mask=offs < n, other=0.0)
        acc += cur.to(tl.float32)
    tl.store(dst + tl.program_id(0), tl.sum(acc))


@triton.jit
def empty_launch(dst):
    tl.store(dst + tl.program_id(0), 0.0)


def variants(src: torch.Tensor, sms: int):
    n = src.numel()
    dst = torch.empty(max(4 * sms, triton.cdiv(n, 1024)), device=src.device)
    out = {}
    for block, warps in [(2048, 4), (4096, 4), (8192, 4), (8192, 8), (16384, 8), (32768, 8)]:
        grid = (triton.cdiv(n, block),)
        out[f"blocks {block * 2 // 1024}KB w{warps}"] = lambda g=grid, b=block, w=warps: stream_read[g](
            src, dst, n, BLOCK=b, num_warps=w
        )
    for per_sm, block, warps in [(1, 8192, 8), (2, 4096, 8), (4, 4096, 4), (8, 2048, 4), (16, 1024, 4)]:
        grid = (per_sm * sms,)
        out[f"persistent {per_sm}/SM {block * 2 // 1024}KB w{warps}"] = lambda g=grid, b=block, w=warps: (
            persistent_read[g](src, dst, n, BLOCK=b, num_warps=w)
        )
    grid = (triton.cdiv(n, 8192),)
    out["empty launch (grid of blocks 16KB)"] = lambda g=grid: empty_launch[g](dst, num_warps=4)
    return out


def main(argv: list[str] | None = None) -> int:
    args = probe_parser(__doc__).parse_args(argv)
    flush, sink = flush_buffers()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for elem in (2, 1):
        for N, K in WEIGHTS:
            nbytes = (N * K + K) * elem + N * 2
            src = torch.randn(nbytes // 2, device="cuda", dtype=torch.float16)
            for name, fn in variants(src, sms).items():
                med, times = timed(fn, args.reps, flush, sink)
                row = {"N": N, "K": K, "elem_bytes": elem, "bytes": nbytes, "variant": name, **times,
                       "gbps": round(nbytes / med / 1e3, 1), **against_rung0(nbytes, med)}  # fmt: skip
                record(rows, row)
    write_csv(args.output, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
