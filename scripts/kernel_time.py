"""Kernel-only GPU time of each mode on a list of shapes, from CUPTI (torch.profiler): an
independent check of the survey's `--gpu-time` clock, which times each call between two CUDA
events and so also counts the gap between an event and the kernel.

Each timed call is preceded by a read of 2x L2 (`l2_flush`, a kernel of its own name), so its
operands come from HBM and no dirty line is left to be written back during it (a flush by
writing cost every kernel after it ~10 %: the first version of this script); the kernels a call
launches between two flushes are summed (cuBLAS may launch two). Reported per (shape, mode): the
median and p20/p80 of the summed durations over --reps calls, the GB/s of A, B and C over the
median, and two references of as many bytes as the GEMM moves: `copy` (`Tensor.copy_`, bytes read
plus written) and `read` (a plain-Triton stream of 16-byte loads that writes one float per
program): the memory rate at this size.

A Gluon rung may carry overrides of its default config (integer fields, separated by colons),
e.g. `swapab@SPLIT_K=4:STAGES=6` or `warpspec@STAGES=4:EPILOGUE_BUFFERS=2`; the registry picks
the rung's module for this GPU. Such a config is checked once against cuBLAS's output (NaN-poisoned,
max error within 2 % of the output's largest value) before it is timed.

Where the weight lies in memory is the caching allocator's choice, made from what the process
allocated before. `--b-offset 0,512,65536` times each shape with the weight copied to each of those
byte offsets in an allocation of its own (0: where the inputs put it), and every row records the
offset and the weight's address modulo 2 MiB (`b_offset`, `b_addr_mod_2mib`).

The mode `grouped` times the same product through `grouped_matmul` as a single expert's, on the
grouped kernels' persistent ring (`as_one_expert`).

    PYTHONPATH=src python3 scripts/kernel_time.py --shapes results/h100-decode-gputime/shapes.csv \
        --modes torch,swapab,splitk --dtype bf16 --output out/kernel-time.csv
"""

from __future__ import annotations

import argparse
import csv
import functools
import statistics
import sys
from dataclasses import replace

import torch
import triton
import triton.language as tl
from torch.autograd import DeviceType

from gluon_survey import grouped_matmul, matmul, registry
from gluon_survey.api import _flat_scales, result_dtype, target_of
from gluon_survey.driver.check import make_inputs
from gluon_survey.driver.shapes import read_csv

DTYPES = ("fp16", "bf16", "fp8")  # fp8 with --scaling tensor or row
FLUSH = "l2_flush"
READ_BLOCK = 8192
# Rung 0 (the best of the copy ladder, GB/s) of each GPU the probes have run on: the H100's from
# results/h100-memcpy, the H200's from results/h200-moe-decode/memcpy-bf16.md. A row's `of_rung0`
# is against this GPU's; on a GPU not named here the columns are left empty.
RUNG0_GBPS = {"H100": 3015.0, "H200": 4258.0}


# Two kernels with one body: the flush before each call and the read reference must have different
# names, because the profile is split into calls at the flush kernels.
@triton.jit
def l2_flush(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + tl.program_id(0), tl.sum(tl.load(src + offs, mask=offs < n, other=0.0)))


@triton.jit
def stream_read(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst + tl.program_id(0), tl.sum(tl.load(src + offs, mask=offs < n, other=0.0)))


def operands(shape, dtype: str, scaling: str):
    """The survey's inputs (`check.make_inputs`, seed 0, B the transpose view of an [N, K] weight):
    a, b and the fp8 scales as keyword arguments ({} for fp16/bf16)."""
    name = "fp8-row" if dtype == "fp8" and scaling == "row" else dtype
    inputs = make_inputs(shape, name, "t", 0, "cuda")
    return inputs.a, inputs.b, inputs.scales


def placed(b: torch.Tensor, offset: int) -> torch.Tensor:
    """B, the transpose view of an [N, K] weight, copied to `offset` bytes past the start of an
    allocation of its own: where the weight lies in memory, which the caching allocator otherwise
    decides from what the process allocated before (0: B as it is; `main` has checked that it is a
    multiple of 16, as a TMA base must be)."""
    if offset == 0:
        return b
    w = b.t()  # [N, K], contiguous
    buf = torch.empty(w.numel() + offset // w.element_size(), dtype=w.dtype, device=w.device)
    moved = buf[offset // w.element_size() :].view(w.shape)
    moved.copy_(w)
    return moved.t()


def call_of(mode: str, a, b, scales, nbytes: int):
    """The call to time, and the bytes it moves when that is not the GEMM's."""
    if mode == "copy":
        src = torch.randn(max(1, nbytes // 4), device="cuda", dtype=torch.float16)
        dst = torch.empty_like(src)
        return lambda: dst.copy_(src), 4 * src.numel()
    if mode == "read":
        src = torch.randn(max(1, nbytes // 2), device="cuda", dtype=torch.float16)
        grid = triton.cdiv(src.numel(), READ_BLOCK)
        dst = torch.empty(grid, device="cuda")
        return lambda: stream_read[(grid,)](src, dst, src.numel(), BLOCK=READ_BLOCK), 2 * src.numel()
    if mode == "grouped":
        return as_one_expert(a, b, scales), None
    name, _, overrides = mode.partition("@")
    if not overrides:
        return lambda: matmul(a, b, kernel=mode, **scales), None
    target = target_of(a.device)
    rung = registry.get(name).provider(target.capability)  # this GPU's module of the rung
    fields = {k: int(v) for k, v in (kv.split("=") for kv in overrides.split(":"))}
    cfg = rung.config_for(target.capability, a.shape[1], bool(scales))
    out = torch.empty(a.shape[0], b.shape[1], device="cuda", dtype=result_dtype(a))
    flat = None
    if scales:
        kind = "row" if scales["scale_a"].numel() > 1 else "tensor"
        flat = _flat_scales(scales["scale_a"], scales["scale_b"], kind)
    return checked(
        mode, rung.prepare(a, b, out, target, replace(cfg, **fields), flat).fn, out, a, b, scales
    ), None


def checked(label: str, fn, out, a, b, scales):
    """`fn`, after one call of it into a NaN-poisoned `out` was checked against cuBLAS's product
    of the same operands (max error within 2 % of the output's largest value)."""
    out.fill_(float("nan"))
    fn()
    check_close(label, out, matmul(a, b, kernel="torch", **scales).float(), 0.02)
    return fn


def as_one_expert(a, b, scales):
    """The mode `grouped`: the same product through `grouped_matmul` as one expert's (w [1, K, N],
    offs [M]; fp8 scales spread to its per-token and per-column vectors), so that a dense product
    can be timed on the grouped kernels' persistent ring (at M <= 512, `grouped-swapab`: one
    program an SM walking the 64-row weight tiles). Checked once as an override config is."""
    M, N = a.shape[0], b.shape[1]
    w = b.t().unsqueeze(0).transpose(1, 2)  # [1, K, N]: the transpose view of a [1, N, K] weight
    offs = torch.tensor([M], dtype=torch.int32, device=a.device)
    kw = {}
    if scales:
        kw = {
            "scale_x": scales["scale_a"].reshape(-1).expand(M).contiguous(),
            "scale_w": scales["scale_b"].reshape(1, -1).expand(1, N).contiguous(),
        }
    out = torch.empty(M, N, device=a.device, dtype=result_dtype(a))
    return checked("grouped", lambda: grouped_matmul(a, w, offs, out=out, **kw), out, a, b, scales)


def kernel_times(fn, reps: int, flush: torch.Tensor, sink: torch.Tensor) -> tuple[list[float], list[str]]:
    """The GPU time (µs) of each of `reps` calls of `fn`, each after an L2 flush: the summed
    durations of the kernels it launched; and the names of the first call's kernels, in launch order
    (which kernel cuBLAS's heuristic picked for the shape)."""
    fn()  # compile, plan, cuBLAS heuristics
    grid = (sink.numel(),)
    l2_flush[grid](flush, sink, flush.numel(), BLOCK=READ_BLOCK)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            l2_flush[grid](flush, sink, flush.numel(), BLOCK=READ_BLOCK)
            fn()
        torch.cuda.synchronize()
    kernels = sorted(
        (e for e in prof.events() if e.device_type == DeviceType.CUDA), key=lambda e: e.time_range.start
    )
    groups: list[float] = []
    names: list[str] = []
    for e in kernels:
        if FLUSH in e.name:
            groups.append(0.0)
        elif groups:
            groups[-1] += e.time_range.elapsed_us()
            if len(groups) == 1:
                names.append(e.name)
    if len(groups) != reps or not all(groups):
        raise RuntimeError(
            f"expected {reps} calls between flushes, got {len(groups)}: {[e.name for e in kernels[:6]]}"
        )
    return groups, names


def flush_buffers() -> tuple[torch.Tensor, torch.Tensor]:
    """`kernel_times`' flush source (twice this GPU's L2, fp32) and its per-program sink."""
    flush = torch.randn(2 * torch.cuda.get_device_properties(0).L2_cache_size // 4, device="cuda")
    return flush, torch.empty(triton.cdiv(flush.numel(), READ_BLOCK), device="cuda")


def spread(times: list[float]) -> tuple[float, float, float]:
    """Median, p20 and p80 of `kernel_times`' calls (µs)."""
    q = statistics.quantiles(times, n=5)
    return statistics.median(times), q[0], q[-1]


def timed(fn, reps: int, flush: torch.Tensor, sink: torch.Tensor) -> tuple[float, dict[str, float | str]]:
    """`kernel_times`' calls of `fn`: the median (µs) and a result row's timing columns, us_median,
    us_p20 and us_p80 to two decimals, and `kernels`, the names of a call's kernels joined by " + "."""
    times, names = kernel_times(fn, reps, flush, sink)
    med, p20, p80 = spread(times)
    row = {"us_median": round(med, 2), "us_p20": round(p20, 2), "us_p80": round(p80, 2)}
    return med, row | {"kernels": " + ".join(names)}


@functools.cache
def rung0_gbps() -> float | None:
    """This GPU's rung 0 (`RUNG0_GBPS`), or None where it was not measured."""
    name = torch.cuda.get_device_name()
    return next((rate for gpu, rate in RUNG0_GBPS.items() if gpu in name), None)


def against_rung0(nbytes: int, med: float) -> dict[str, float | str]:
    """A result row's columns for `nbytes` moved in `med` µs: the rate over this GPU's rung 0
    (of_rung0) and the time 0.90 of it allows (us_at_0.90); empty where rung 0 is not known."""
    rate = rung0_gbps()
    if rate is None:
        return {"of_rung0": "", "us_at_0.90": ""}
    return {
        "of_rung0": round(nbytes / med / 1e3 / rate, 3),
        "us_at_0.90": round(nbytes / (0.9 * rate) / 1e3, 2),
    }


def record(rows: list[dict], row: dict) -> None:
    """Keep a result row and print it as a CSV line (the scripts' progress)."""
    rows.append(row)
    print(",".join(str(v) for v in row.values()), flush=True)


def check_close(label: str, got: torch.Tensor, ref: torch.Tensor, tol: float) -> None:
    """Raise unless max |got - ref| <= tol * max |ref|; a NaN (an unwritten tile) fails too."""
    err = ((got.float() - ref).abs().max() / ref.abs().max()).item()
    if not err <= tol:
        raise RuntimeError(f"{label}: relative error {err:.3g}")


def probe_parser(doc: str) -> argparse.ArgumentParser:
    """The options every timing script here takes (--reps, --output), described by the first line
    of its docstring `doc`."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--output", required=True)
    return p


def main(argv: list[str] | None = None) -> int:
    p = probe_parser(__doc__)
    p.add_argument("--shapes", required=True, help="CSV of M,N,K")
    p.add_argument("--modes", default="torch,swapab,splitk")
    p.add_argument("--dtype", default="bf16", choices=DTYPES)
    p.add_argument("--scaling", default="tensor", choices=("tensor", "row"), help="fp8 scales")
    p.add_argument(
        "--b-offset",
        default="0",
        help="comma-separated byte offsets (multiples of 16) at which each shape's weight is placed in an "
        "allocation of its own, timed in turn (0: where make_inputs put it)",
    )
    args = p.parse_args(argv)
    try:
        offsets = [int(v) for v in args.b_offset.split(",")]
    except ValueError:
        p.error(f"--b-offset {args.b_offset!r}: give comma-separated integers, e.g. 0,512,65536")
    if bad := [o for o in offsets if o < 0 or o % 16]:
        p.error(f"--b-offset: {bad} are not non-negative multiples of 16 (TMA bases are 16-byte aligned)")
    flush, sink = flush_buffers()
    rows = []
    for shape, offset in ((s, o) for s in read_csv(args.shapes) for o in offsets):
        a, b, scales = operands(shape, args.dtype, args.scaling)
        b = placed(b, offset)
        moved = a.numel() * a.element_size() + b.numel() * b.element_size() + shape.M * shape.N * 2
        for mode in ["copy", "read", *args.modes.split(",")]:
            try:
                fn, copy_bytes = call_of(mode, a, b, scales, moved)
                med, times = timed(fn, args.reps, flush, sink)
            except Exception as exc:  # a config that fails or cannot run here is a finding, not a crash
                first = str(exc).splitlines()[0][:200] if str(exc) else ""
                print(f"{shape.label} {mode}: {type(exc).__name__}: {first}", flush=True)
                continue
            nbytes = copy_bytes or moved
            row = {
                "M": shape.M, "N": shape.N, "K": shape.K, "dtype": args.dtype, "scaling": args.scaling,
                "mode": mode, **times, "bytes": nbytes, "gbps": round(nbytes / med / 1e3, 1),
                "b_offset": offset, "b_addr_mod_2mib": b.data_ptr() % (2 << 20),
            }  # fmt: skip
            record(rows, row)
    write_csv(args.output, rows)
    return 0


def write_csv(path: str, rows: list[dict]) -> None:
    """Rows of one shape of dict, with a header of their keys."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    sys.exit(main())
