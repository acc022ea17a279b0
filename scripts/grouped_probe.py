"""Kernel-only GPU time of `grouped_matmul` and of each of its two kernels against
`torch._grouped_mm` and a per-expert loop of cuBLAS, on mixture-of-experts expert shapes, from
decode (1, 4, 16, 64 tokens) to prefill (512, 4096), or the --tokens given. The rows each expert
gets are the uniform split of S = T * top-k, or with --routing uniform, zipf or half the routing
`--shapes moe` draws for the same T (`shapes.routing_counts`, the driver's seed 0): the cells of
a sweep, kernel-only and per config. Each call is preceded
by a read of 2x L2 (kernel_time.py's flush); the output of each is checked against an fp32
per-expert product first.

Modes: `gluon` (grouped_matmul: the swap-AB kernel up to grouped_auto.DECODE_ROWS token-slots,
the 128-row kernel above), `gluon 128-row` and `gluon swap-AB` (each kernel alone, at every size:
where the threshold belongs), `torch._grouped_mm`, `loop`. `--tiles` also times each config of
both kernels (`gluon 128x128`, `gluon 128x256`, `gluon swap-AB T16` / `T32` / `T64`), not only the
ones they pick. Each row has the bytes of the touched experts' weights, the tokens and the output
over this GPU's rung 0 (`of_rung0`, kernel_time.RUNG0_GBPS) and the time 0.90 of it allows.

    PYTHONPATH=src python3 scripts/grouped_probe.py --output out/grouped-probe.csv [--tiles]
    PYTHONPATH=src python3 scripts/grouped_probe.py --tiles --tokens 512 --routing half,uniform,zipf \
        --output out/grouped-probe-512.csv
    PYTHONPATH=src python3 scripts/grouped_probe.py --tiles --models mixtral-8x22b,phi-3.5-moe \
        --projections down --tokens 320,448 --routing half,uniform,zipf --output out/holdout.csv

`--models` takes the preset's four and five models outside it (`HOLDOUT`), to judge a rule drawn
from the preset's runs on weights it has not seen.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_time import against_rung0, check_close, flush_buffers, probe_parser, record, timed, write_csv

from gluon_survey import api, grouped_matmul
from gluon_survey import grouped as grouped_api
from gluon_survey.driver.settings import DEFAULTS
from gluon_survey.driver.shapes import ROUTINGS, GroupedShape, routing_counts
from gluon_survey.kernels import grouped as kernel
from gluon_survey.kernels import grouped_swapab as swapab

# (name, experts, top-k, N, K): each model's gate_up (N = 2I, K = H) and down (N = H, K = I).
MODELS = (
    ("mixtral-8x7b", 8, 2, 4096, 14336),
    ("qwen3-30b-a3b", 128, 8, 2048, 768),
    ("deepseek-v3", 256, 8, 7168, 2048),
    ("gpt-oss-20b", 32, 4, 2880, 2880),
)
# Models outside `--shapes moe`, for judging a rule drawn from the preset's on weights it has not
# seen (`--models`): Mixtral-8x22B, Phi-3.5-MoE, DBRX, Qwen2-57B-A14B (its routed experts), OLMoE-1B-7B.
HOLDOUT = (
    ("mixtral-8x22b", 8, 2, 6144, 16384),
    ("phi-3.5-moe", 16, 2, 4096, 6400),
    ("dbrx", 16, 4, 6144, 10752),
    ("qwen2-57b-a14b", 64, 8, 3584, 2560),
    ("olmoe-1b-7b", 64, 8, 2048, 1024),
)
TOKENS = (1, 4, 16, 64, 512, 4096)
PROJECTIONS = ("gate_up", "down")


def problems(tokens=TOKENS, models=MODELS, projections=PROJECTIONS):
    for name, E, topk, H, I in models:
        for proj, N, K in (("gate_up", 2 * I, H), ("down", H, I)):
            if proj in projections:
                for T in tokens:
                    yield f"{name} {proj}", E, topk, N, K, T


def split(E: int, topk: int, N: int, K: int, T: int, routing: str | None) -> torch.Tensor:
    """Rows per expert: S = T * topk split evenly (routing None), or as the sweep routes them."""
    if routing is not None:
        return torch.tensor(routing_counts(GroupedShape(T, N, K, E, topk, routing), DEFAULTS.seed))
    S = T * topk
    counts = torch.full((E,), S // E, dtype=torch.int64)
    counts[: S % E] += 1
    return counts


def ranges(offs: torch.Tensor) -> list[tuple[int, int]]:
    ends = offs.tolist()
    return list(zip([0, *ends[:-1]], ends, strict=True))


def calls_of(x, w, offs, out, tiles: bool = False) -> dict:
    """The calls on one problem (the loop reads the offsets to the host once, here): grouped_matmul,
    each kernel alone, and with `tiles` each kernel's launch with each of its configs."""
    spans = ranges(offs)
    calls = {"gluon": lambda: grouped_matmul(x, w, offs, out=out)}
    for mode, label in (("grouped", "gluon 128-row"), ("grouped-swapab", "gluon swap-AB")):
        launch = grouped_api.prepare(mode, x, w, offs, out)
        calls[label] = lambda fn=launch.fn: fn() or out
    if tiles:
        target = api.target_of(x.device)
        major = target.capability[0]
        for cfg in (kernel.CONFIGS[major], kernel.WIDE_CONFIGS[major]):
            launch = kernel.prepare(x, w, offs, out, target, cfg)
            calls[f"gluon {cfg.BLOCK_M}x{cfg.BLOCK_N}"] = lambda fn=launch.fn: fn() or out
        for width, cfg in swapab.CONFIGS[major].items():
            launch = swapab.prepare(x, w, offs, out, target, cfg)
            calls[f"gluon swap-AB T{width}"] = lambda fn=launch.fn: fn() or out
    calls["torch._grouped_mm"] = lambda: torch._grouped_mm(x, w, offs=offs)
    calls["loop"] = lambda: torch.cat([x[s:e] @ w[i] for i, (s, e) in enumerate(spans)])
    return calls


def main(argv=None) -> int:
    parser = probe_parser(__doc__)
    parser.add_argument("--tiles", action="store_true", help="also time each config of both kernels")
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="T values, comma-separated")
    parser.add_argument(
        "--routing", default=None, help=f"comma-separated, of {', '.join(ROUTINGS)} (default: an even split)"
    )
    known = {m[0]: m for m in MODELS + HOLDOUT}
    parser.add_argument(
        "--models",
        default=",".join(m[0] for m in MODELS),
        help=f"comma-separated, of {', '.join(known)} (default: the --shapes moe preset's four)",
    )
    parser.add_argument("--projections", default=",".join(PROJECTIONS), help="gate_up, down or both")
    args = parser.parse_args(argv)
    routings = args.routing.split(",") if args.routing else [None]
    if unknown := [r for r in routings if r not in ROUTINGS and r is not None]:
        parser.error(f"unknown --routing {', '.join(unknown)}; use {', '.join(ROUTINGS)}")
    if unknown := [m for m in args.models.split(",") if m not in known]:
        parser.error(f"unknown --models {', '.join(unknown)}; use {', '.join(known)}")
    if unknown := [p for p in args.projections.split(",") if p not in PROJECTIONS]:
        parser.error(f"unknown --projections {', '.join(unknown)}; use {', '.join(PROJECTIONS)}")
    models = [known[m] for m in args.models.split(",")]
    flush, sink = flush_buffers()
    rows: list[dict] = []
    for (label, E, topk, N, K, T), routing in itertools.product(
        problems(tuple(map(int, args.tokens.split(","))), models, args.projections.split(",")), routings
    ):
        S = T * topk
        g = torch.Generator(device="cuda").manual_seed(0)
        counts = split(E, topk, N, K, T, routing)
        touched = int((counts > 0).sum())
        x = torch.randn(S, K, device="cuda", generator=g, dtype=torch.bfloat16)
        w = torch.randn(E, N, K, device="cuda", generator=g, dtype=torch.bfloat16).transpose(1, 2)
        offs = counts.cumsum(0).to(torch.int32).cuda()
        ref = torch.cat([x[s:e].float() @ w[i].float() for i, (s, e) in enumerate(ranges(offs))])
        out = torch.full((S, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        flops = 2 * S * N * K
        nbytes = 2 * ((S + touched * N) * K + S * N)  # the touched experts' weights, x and out, once
        for mode, fn in calls_of(x, w, offs, out, args.tiles).items():
            try:
                out.fill_(float("nan"))  # each kernel mode's check sees only its own writes
                check_close(f"{label} {mode}", fn(), ref, 0.02)
                med, times = timed(fn, args.reps, flush, sink)
            except Exception as exc:  # a finding, not a crash
                print(
                    f"{label} T={T} {routing or 'even'} {mode}: {type(exc).__name__}: {str(exc)[:200]}",
                    flush=True,
                )
                continue
            row = {
                "problem": label, "E": E, "topk": topk, "N": N, "K": K, "T": T, "S": S,
                "routing": routing or "even",
                "touched": touched, "mode": mode, **times, "tflops": round(flops / med / 1e6, 1),
                **against_rung0(nbytes, med),
            }  # fmt: skip
            record(rows, row)
    write_csv(args.output, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
