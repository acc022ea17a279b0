"""The `grouped-auto` mode: what `gluon_survey.grouped_matmul` runs. Two rungs compute a grouped
GEMM, and which is faster depends on how many rows each expert gets:

* `grouped` (kernels/grouped.py): 128-row tiles of tokens, 128 or 256 columns wide. Prefill:
  many rows an expert, and a tile's MMA is full.
* `grouped-swapab` (kernels/grouped_swapab.py): the transpose, 64 weight rows by a token tile of
  16-64. Decode: one to a few rows an expert, where a 128-row tile multiplies padding and its
  wide weight box leaves few tiles for the SMs.

The choice is by S, x's rows (the token-slots, T * top-k), which the host knows without reading
the offsets (no sync, so a call stays CUDA-graph capturable): up to DECODE_ROWS the swap-AB
kernel, above it the 128-row one. Both kernels take fp16/bf16 and fp8 e4m3 (row-wise scales),
and fp8 takes the same threshold (`FP8_SWAPAB`): the 128-row kernel's fp8 misses were the decode
cells, where the swap-AB kernel fixed them as it had fixed bf16's (docs/perf-notes.md, entries
59, 61 and 63). On Blackwell (sm_100) the `grouped` mode's kernel is its tcgen05 version
(kernels/grouped_tcgen05.py, the registry's provider there) and runs at every S: the swap-AB
kernel is wgmma's, Hopper's only. Each launch's config says which kernel ran and why. The driver
measures this mode like the two rungs (`--shapes moe`), so the threshold can be read off one run."""

from __future__ import annotations

import os
from dataclasses import replace

import torch

from . import registry
from .kernels import grouped_swapab
from .kernels.plan import GroupedPlan
from .launch import Launch, Scales, Target

# S (token-slots) up to which grouped_matmul runs the swap-AB kernel: 64 tokens at top-8
# (Qwen3-30B-A3B, DeepSeek-V3), 128 at top-4 (GPT-OSS-20B), 256 at top-2 (Mixtral-8x7B). A first
# guess: every decode cell of `--shapes moe` (T <= 64) is below it, where the swap-AB kernel ran
# at 1.06x torch._grouped_mm or more (results/h100-moe-decode), and every prefill cell (T >= 512)
# above it; whether it is the crossover (the swap-AB kernel at T >= 512) is not yet measured.
# docs/perf-notes.md, entry 58. fp8 takes the same line (entry 63).
DECODE_ROWS = 512
SWAPAB_DTYPES = (torch.float16, torch.bfloat16, torch.float8_e4m3fn)
# fp8 on the swap-AB kernel: passed tests/test_grouped_gpu.py on an H100 (commit ecfd14d) and ran
# `--shapes moe` fp8-row at 1.44x / 1.20x / 1.14x torch._scaled_grouped_mm at T = 1 / 16 / 64,
# where the 128-row kernel had 1.21x / 1.05x / 1.05x (results/h100-moe-fp8-swapab; entry 63). Off
# (fp8 on the 128-row kernel at every S) with GLUON_SURVEY_FP8_SWAPAB=0 (read at import) or here.


def fp8_swapab_from(environ) -> bool:
    """`FP8_SWAPAB`'s value from an environment: on unless GLUON_SURVEY_FP8_SWAPAB is "0"."""
    return environ.get("GLUON_SURVEY_FP8_SWAPAB", "1") != "0"


FP8_SWAPAB = fp8_swapab_from(os.environ)

__all__ = ["DECODE_ROWS", "FP8_SWAPAB", "SWAPAB_DTYPES", "choose", "plan", "prepare", "unsupported_reason"]


def unsupported_reason(capability: tuple[int, int]) -> str | None:
    """Hopper runs both kernels, Blackwell (sm_100) the 128-row one only (`choose`)."""
    reason = registry.get("grouped").unsupported_reason(capability)
    if reason or _swapab_reason(capability):
        return reason
    return grouped_swapab.unsupported_reason(capability)


def _swapab_reason(capability: tuple[int, int]) -> str | None:
    """Why this GPU never gets the swap-AB kernel, where it runs the 128-row one only: sm_100."""
    if capability[0] == 10:
        return f"sm_{capability[0]}{capability[1]}: the swap-AB kernel is Hopper's (wgmma)"
    return None


def choose(S: int, dtype: torch.dtype, capability: tuple[int, int]) -> tuple[str, str]:
    """(the grouped mode that runs S token-slots of this dtype on a GPU of this capability, why)."""
    if reason := _swapab_reason(capability):
        return "grouped", f"{reason}; the 128-row tiles at every S"
    if dtype not in SWAPAB_DTYPES:
        return "grouped", f"{dtype} operands: the swap-AB kernel takes fp16, bf16 and e4m3 ones only"
    if dtype == torch.float8_e4m3fn and not FP8_SWAPAB:
        why = "fp8: the swap-AB kernel's fp8 path is switched off (grouped_auto.FP8_SWAPAB)"
        return "grouped", f"{why}; the 128-row tiles at every S"
    if S <= DECODE_ROWS:
        return "grouped-swapab", f"S = {S} <= {DECODE_ROWS} token-slots: few rows an expert (decode)"
    return "grouped", f"S = {S} > {DECODE_ROWS} token-slots: 128-row tiles (prefill)"


def plan(x, w, target: Target, scales: Scales | None = None) -> GroupedPlan:
    """The plan of the kernel `choose` picks, on operands `gluon_survey.grouped` has checked (fp8
    ones with their `scales`); its config names the mode that runs (`mode`) and why (`why`). The
    `grouped` mode's kernel is the registry's provider for this GPU: kernels/grouped.py on sm_90,
    kernels/grouped_tcgen05.py on sm_100."""
    mode, why = choose(x.shape[0], x.dtype, target.capability)
    if mode == "grouped-swapab":
        chosen = grouped_swapab.plan(x, w, target, scales=scales)
    else:
        chosen = registry.get("grouped").provider(target.capability).plan(x, w, target, scales=scales)
    return replace(chosen, config={"mode": mode, **chosen.config, "why": why})


def prepare(x, w, offs, out, target: Target, scales: Scales | None = None) -> Launch:
    """A ready launch of `plan`'s plan on these tensors (what the driver times)."""
    return plan(x, w, target, scales).bind(x, w, offs, out, scales)
