"""Kernel-only GPU time of the gate-and-up projection with its SwiGLU fused into the grouped GEMM's
epilogue (`grouped_swiglu`) against the unfused path (`grouped_matmul` writing h [S, 2I], then
torch's silu(h[:, :I]) * h[:, I:], what `gluon_survey.experts` runs by default), on the gate_up
shapes of `--shapes moe`'s four models with uniform routing at T = 1, 16, 512, 4096, 16384
tokens. Each call is preceded by a read of 2x L2 (kernel_time.py's flush) and its kernels are
summed (the unfused path is three: the GEMM, silu, the product); each output is checked first,
NaN-poisoned, against an fp32 per-expert product and gate.

Modes: `fused` (grouped_swiglu: the 128-row kernel with GLU 1, its tile by 2I), `unfused`
(grouped_matmul + silu * mul), `gemm only` (grouped_matmul alone: the unfused path's GEMM, whose
time the fused kernel should land near), `torch` (torch._grouped_mm + silu * mul). `--tiles`
also times each GLU config (`fused 128x128`, `fused 128x256`: MMA tiles, 64 and 128 output
columns). Each row has `saved_mb`, the bytes the fusion saves against a single-kernel gate
(h's S x 2I written and read back, less the S x I that the fused kernel writes in its place: 8 S I
bytes; torch's two-kernel gate moves 4 S I more) and `saved_us`, their time at rung 0's rate.

    PYTHONPATH=src python3 scripts/glu_probe.py --output out/glu-probe.csv [--tiles]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_time import check_close, flush_buffers, probe_parser, record, rung0_gbps, timed, write_csv

from gluon_survey import api, grouped_matmul, grouped_swiglu
from gluon_survey.driver.shapes import MOE_MODELS
from gluon_survey.kernels import grouped as kernel

TOKENS = (1, 16, 512, 4096, 16384)


def ranges(offs: torch.Tensor) -> list[tuple[int, int]]:
    ends = offs.tolist()
    return list(zip([0, *ends[:-1]], ends, strict=True))


def reference(x, w, offs, I: int) -> torch.Tensor:
    """silu(gate) * up of each expert's fp32 product, [S, I] fp32 (rows past offs[-1]: none here)."""
    parts = []
    for e, (s, t) in enumerate(ranges(offs)):
        h = x[s:t].float() @ w[e].float()
        parts.append(F.silu(h[:, :I]) * h[:, I:])
    return torch.cat(parts)


def calls_of(x, w, offs, out, h, tiles: bool = False) -> dict:
    I = out.shape[1]

    def unfused():
        grouped_matmul(x, w, offs, out=h)
        return torch.mul(F.silu(h[:, :I]), h[:, I:], out=out)

    def torch_path():
        g = torch._grouped_mm(x, w, offs=offs)
        return torch.mul(F.silu(g[:, :I]), g[:, I:], out=out)

    calls = {
        "fused": lambda: grouped_swiglu(x, w, offs, out=out),
        "unfused": unfused,
        "gemm only": lambda: grouped_matmul(x, w, offs, out=h),
        "torch": torch_path,
    }
    if tiles:
        target = api.target_of(x.device)
        for cfg in (kernel.GLU_CONFIGS[target.capability[0]], kernel.GLU_WIDE_CONFIGS[target.capability[0]]):
            launch = kernel.prepare(x, w, offs, out, target, cfg, glu=True)
            calls[f"fused {cfg.BLOCK_M}x{cfg.BLOCK_N}"] = lambda fn=launch.fn: fn() or out
    return calls


def main(argv=None) -> int:
    parser = probe_parser(__doc__)
    parser.add_argument("--tiles", action="store_true", help="also time each GLU config of the kernel")
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="T values, comma-separated")
    args = parser.parse_args(argv)
    flush, sink = flush_buffers()
    rows: list[dict] = []
    for model in MOE_MODELS:
        E, topk, K, I = model.experts, model.topk, model.hidden_size, model.intermediate_size
        for T in map(int, args.tokens.split(",")):
            S = T * topk
            g = torch.Generator(device="cuda").manual_seed(0)
            counts = torch.full((E,), S // E, dtype=torch.int64)
            counts[: S % E] += 1
            touched = int((counts > 0).sum())
            x = torch.randn(S, K, device="cuda", generator=g, dtype=torch.bfloat16)
            w = torch.randn(E, 2 * I, K, device="cuda", generator=g, dtype=torch.bfloat16).mul_(K**-0.5)
            w = w.transpose(1, 2)  # the [E, K, 2I] view of gate_up_proj's [E, 2I, K]
            offs = counts.cumsum(0).to(torch.int32).cuda()
            ref = reference(x, w, offs, I)
            out = torch.empty(S, I, device="cuda", dtype=torch.bfloat16)
            h = torch.empty(S, 2 * I, device="cuda", dtype=torch.bfloat16)
            saved = 8 * S * I  # bytes: h written (2 S I x 2 B) and read back, less the S I fused write
            for mode, fn in calls_of(x, w, offs, out, h, args.tiles).items():
                try:
                    out.fill_(float("nan"))  # each mode's check sees only its own writes
                    h.fill_(float("nan"))
                    got = fn()
                    if mode != "gemm only":
                        check_close(f"{model.name} T={T} {mode}", got, ref, 0.02)
                    med, times = timed(fn, args.reps, flush, sink)
                except Exception as exc:  # a finding, not a crash
                    print(f"{model.name} T={T} {mode}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                    continue
                row = {
                    "model": model.name, "E": E, "topk": topk, "I": I, "K": K, "T": T, "S": S,
                    "touched": touched, "mode": mode, **times,
                    "tflops": round(2 * S * 2 * I * K / med / 1e6, 1),
                    "saved_mb": round(saved / 1e6, 2),
                    "saved_us": round(saved / rate / 1e3, 2) if (rate := rung0_gbps()) else "",
                }  # fmt: skip
                record(rows, row)
            del x, w, ref, out, h
            torch.cuda.empty_cache()
    write_csv(args.output, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
