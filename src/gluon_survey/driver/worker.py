"""One mode, measured over a list of (shape, dtype, B layout, A layout) tasks, in a process of its own.

Started by `gluon_survey.driver.runner` as `python -m gluon_survey.driver.worker`, so that a kernel
that crashes the process, corrupts the CUDA context or never returns costs one row, not the survey.

Protocol: the parent writes one JSON line, the job (`mode`, `tasks`, timing settings), to stdin and
keeps stdin open; when stdin closes the parent is gone and the worker exits. The worker writes JSON
lines to stdout: ``{"event": "start", "task": i}`` when it begins task i, ``{"event": "phase",
"task": i, "phase": ...}`` as it moves from compiling to checking to timing, ``{"event": "row",
"task": i, "row": {...}}`` with the outcome, and ``{"event": "done"}``. Anything libraries print
goes to stderr, which the parent keeps the tail of for error messages. After an error that leaves
the CUDA context unusable (an illegal address is sticky) the worker exits between tasks, and the
parent starts a fresh one for the rest.

Per task: inputs from the seed (`check.make_inputs`; for fp8 / fp8-row, e4m3 operands and the
fp32 scales that go with them); `gluon_survey.api.prepare`, the first call (`compile_s`: prepare +
first call, autotuning included); a NaN-filled output, one call, the check against the fp32
reference with the tolerance rule; then, only if correct, the cold-L2 timing over rotated input
sets (each prepared and called once first), with all outputs NaN-filled before the timer starts and
re-checked after it (a launch that does nothing after its first call fails). With `paired` set,
cuBLAS (`cublas_product`: `torch.matmul`, or `torch._scaled_mm` for fp8) is timed on the same
rotated inputs in windows that alternate with the mode's (`timing.time_paired`: cuBLAS, mode,
cuBLAS, ..., `rounds` windows of the mode), or, where both calls are short (host-bound), in
windows whose calls alternate one by one (`interleaved`), and the row keeps cuBLAS's median over
its windows (`cublas_ms`), the ratio in each round (`x_rounds`) and how far cuBLAS's last window
is from its first (`cublas_drift`): a GPU at its power limit changes clock with temperature over a
run, so the ratio to a cuBLAS timed minutes apart moves by a few per cent, and to one timed
alongside it does not. With `bias` set (`--bias`), every input set has a bias [N], which the mode adds in its
epilogue (`matmul(bias=)`) and cuBLAS through `torch.addmm` (fp8: `torch._scaled_mm(bias=)`),
and the reference adds it too; the modes that add none are SKIPPED (`Provider.no_bias`). With
`queued` set (`--gpu-time`), both are timed queued, in GPU time (`timing`'s module
docstring), and the row counts the calls the host fell behind on (`starved`, `cublas_starved`).
NVML's mean SM clock and power over the timed windows go into the row too.

A task in A layout "t" (`a_layout`: A is the transpose view of a [K, M] matrix, as in a weight's
gradient; `check.make_inputs`) runs every mode on that view, as a user's `matmul` call gets it: a
mode that reads it in place (`gluon_survey.api`: its config says `a_layout` "t") is timed as
it is; for one that does not, the timed call copies A to row-major first (`_copying_a`: the copy
`matmul` makes each call, into a buffer made once) and the config says so (`a_copy`). Paired
cuBLAS takes the view as a transposed operand. fp8 tasks in A layout "t" are SKIPPED
(`check.A_T_FP8`). A launch whose
`fn()` returns its product instead of writing `out` (the torch.compile baseline) is judged on the
tensor it returns.

Grouped tasks (a task with E, topk and routing: `shapes.GroupedShape`, a mixture-of-experts
layer's expert GEMMs) run the same way with the grouped pieces: the per-expert row counts from the
routing and the run's seed (`shapes.routing_counts`, the same for every input set, and kept in the
row as `counts`), `check.make_grouped_inputs`, `prepare(x, w, offs, out)`, the fp32 per-expert
reference (`check.grouped_reference`), cuBLAS per expert as the tolerance's yardstick
(`grouped_cublas_product`) and torch._grouped_mm as the paired baseline (`_grouped_baseline_launch`;
its time goes into `cublas_ms`, its ratio into `x_rounds`). fp8-row grouped tasks take e4m3
operands with the scales scale_x [S] and scale_w [E, N], passed on as keywords like the dense
fp8 scales, the dequantized reference, torch._scaled_mm per expert as the yardstick and
torch._scaled_grouped_mm as the paired baseline (`registry.baseline_of`). The rotation counts the
bytes a call touches (x and the weights of the experts with rows), and never holds more whole
input sets than the memory budget. A grouped mode meeting a dense task, or a dense mode a grouped
one, is SKIPPED saying which modes take it (`Provider.wrong_shape`); a grouped task with
per-tensor fp8 scales is SKIPPED as having no grouped form (`check.GROUPED_FP8`), and the fp16/bf16
tasks of a mode that takes fp8 only (`registry.Mode.sixteen_bit`) as such (`Provider.no_16bit`),
and a decoding mode's grouped tasks with more token-slots an expert than it is for
(`registry.Mode.rows_an_expert`) likewise (`Provider.too_many_rows`), as are a few-token mode's
dense tasks past its tokens (`registry.Mode.tokens`, `Provider.too_many_tokens`).

How a mode is run is a `Provider`, made once per worker by the factory `main` is given:
`cuda_provider` (the default: a registered mode through `gluon_survey.api` on the current CUDA
device). A provider's `prepare` and `baseline` take (a, b, out) and, for fp8 tasks, the keywords
scale_a and scale_b (grouped: (x, w, offs, out) and scale_x, scale_w); the fp8 tasks of a mode
without fp8 kernels (`registry.Mode.fp8`) are SKIPPED, saying which modes have them
(`Provider.no_fp8`). The tests hand `main` providers of their own (CPU tensors, a wall-clock
timer, launches that crash or hang) to test the isolation machinery on a machine without a GPU.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from gluon_survey.driver.settings import Settings

if TYPE_CHECKING:
    import torch

    from gluon_survey.driver.check import GroupedInputs, Inputs
    from gluon_survey.driver.timing import Clock
    from gluon_survey.launch import Launch

ERROR_CHARS = 2000  # longest error message a row carries


@dataclass(frozen=True)
class Provider:
    """How this worker runs its mode: where tensors live, how launches are made and timed."""

    device: str
    prepare: Callable[..., Launch]
    clock: Clock
    unsupported: str | None  # why this machine cannot run the mode, or None
    l2_bytes: int
    memory_budget: Callable[[], int]  # bytes the rotated input copies may take now
    healthy: Callable[[], bool] = lambda: True  # False once the device is unusable for later tasks
    # The paired baseline: cuBLAS's launch on the same inputs (None for the baseline mode itself),
    # timed in windows alternating with this mode's on every task (see `measure`).
    baseline: Callable[..., Launch] | None = None
    telemetry: Callable[[], Any] = contextlib.nullcontext  # a context manager with .result()
    no_fp8: str | None = None  # why the mode cannot take fp8 operands (its fp8 tasks are SKIPPED)
    # The kind of problem the mode computes: dense (prepare(a, b, out, **scales)) or grouped
    # (prepare(x, w, offs, out); the baseline likewise). Tasks of the other kind are SKIPPED with
    # `wrong_shape` as the reason.
    grouped: bool = False
    wrong_shape: str | None = None
    no_bias: str | None = None  # why the mode cannot add a bias (with settings `bias`: SKIPPED)
    no_16bit: str | None = None  # why the mode cannot take fp16/bf16 operands (those tasks SKIPPED)
    # why a grouped task of S token-slots over E experts is too many for the mode (SKIPPED), or None
    too_many_rows: Callable[[int, int], str | None] = lambda S, E: None
    # why a dense task of M tokens is too many for the mode (SKIPPED), or None
    too_many_tokens: Callable[[int], str | None] = lambda M: None


def cuda_provider(mode_name: str) -> Provider:
    """A registered mode, through `gluon_survey.api`, on the current CUDA device."""
    import torch

    from gluon_survey import api, grouped, registry
    from gluon_survey.driver.hardware import telemetry_for_current_device
    from gluon_survey.driver.timing import COPIES_BUDGET_BYTES, CudaEventClock, WallClock

    mode = registry.get(mode_name)

    def prepare(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, **extras: torch.Tensor) -> Launch:
        # extras: the fp8 scales, the bias
        return as_matmul_would(lambda *args, **kw: api.prepare(mode.name, *args, **kw), a, b, out, **extras)

    def prepare_grouped(
        x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, out: torch.Tensor, **scales: torch.Tensor
    ) -> Launch:
        return grouped.prepare(mode.name, x, w, offs, out, out_dtype=out.dtype, **scales)

    def budget() -> int:
        return min(COPIES_BUDGET_BYTES, torch.cuda.mem_get_info()[0] // 2)

    def healthy() -> bool:
        try:
            torch.cuda.synchronize()
            return True
        except RuntimeError:  # a sticky error (illegal address, ...) poisons the context for good
            return False

    kind = {
        "no_fp8": registry.no_fp8_reason(mode),
        "no_bias": registry.no_bias_reason(mode),
        "grouped": mode.grouped,
        "wrong_shape": registry.wrong_shape_reason(mode, not mode.grouped),
        "no_16bit": registry.no_16bit_reason(mode),
        "too_many_rows": lambda S, E: registry.too_many_rows_reason(mode, S, E),
        "too_many_tokens": lambda M: registry.too_many_tokens_reason(mode, M),
    }
    run = prepare_grouped if mode.grouped else prepare
    capability = api.capability()
    if capability is None:  # no GPU: every task is SKIPPED, nothing is timed
        return Provider("cuda", run, WallClock(), mode.unsupported_reason(None), 0, budget, **kind)
    l2_bytes = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    reason = mode.unsupported_reason(capability)
    paired = _grouped_baseline_launch if mode.grouped else _cublas_launch
    baseline = None if mode.name in registry.baselines() else paired
    telemetry = telemetry_for_current_device
    return Provider(
        "cuda", run, CudaEventClock(), reason, l2_bytes, budget, healthy, baseline, telemetry, **kind
    )


A_COPY = "row-major, each call"  # the config's `a_copy`: the timed call copies a transposed A first


def as_matmul_would(prepare: Callable[..., Launch], a: torch.Tensor, b, out, **extras) -> Launch:
    """`prepare(a, b, out, **extras)` (`gluon_survey.api.prepare` of a mode), except that for an `a`
    in A layout "t" that the launch does not read in place (its config has no `a_layout` "t") the
    timed call copies `a` to row-major first (`_copying_a`), as `matmul` does each call."""
    from gluon_survey.launch import a_layout

    launch = prepare(a, b, out, **extras)
    if a_layout(a) == "t" and launch.config.get("a_layout") != "t":
        return _copying_a(lambda row: prepare(row, b, out, **extras), a)
    return launch


def _copying_a(prepare: Callable[[torch.Tensor], Launch], a: torch.Tensor) -> Launch:
    """The launch of a mode that reads A row-major only, for an `a` in A layout "t": `prepare`d on a
    row-major [M, K] buffer (its rows padded to 16 bytes, as `matmul`'s copies are), and each call
    copies `a` into it before the mode's launch, as `matmul` copies such an A each call."""
    import torch

    from gluon_survey.launch import ALIGN, Launch

    M, K = a.shape
    per = ALIGN // a.element_size()
    row = torch.empty(M, -(-K // per) * per, dtype=a.dtype, device=a.device).narrow(1, 0, K)
    row.copy_(a)
    launch = prepare(row)

    def fn() -> object:
        row.copy_(a)
        return launch.fn()

    return Launch(fn, {**launch.config, "a_copy": A_COPY})


def _cublas_launch(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    scale_a: torch.Tensor | None = None,
    scale_b: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> Launch:
    """The paired baseline's launch: what the `torch` mode times, cuBLAS through
    `torch.matmul(a, b, out=out)`, or for fp8 operands (scales given) through
    `torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=out.dtype, out=out, use_fast_accum=True)`:
    bf16 out, as the Gluon kernels write, and the fast accumulation, as they accumulate (the
    `torch` mode's call, baselines/torch_ops.py says why). With a bias, `torch.addmm(bias, a, b,
    out=out)` (cuBLASLt's bias epilogue) or `_scaled_mm(..., bias=bias)`. All also run on CPU
    tensors (the tests' providers)."""
    import torch

    from gluon_survey.launch import Launch

    if scale_a is None and scale_b is None:
        if bias is not None:
            return Launch(lambda: torch.addmm(bias, a, b, out=out))
        return Launch(lambda: torch.matmul(a, b, out=out))
    return Launch(
        lambda: torch._scaled_mm(
            a, b, scale_a, scale_b, bias=bias, out_dtype=out.dtype, out=out, use_fast_accum=True
        )
    )


def cublas_product(
    a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, **scales: torch.Tensor
) -> torch.Tensor:
    """cuBLAS's a @ b (times the fp8 scales, + the bias, when given) written into `out`
    (`_cublas_launch`)."""
    _cublas_launch(a, b, out, **scales).fn()
    return out


def _grouped_baseline_launch(
    x: torch.Tensor,
    w: torch.Tensor,
    offs: torch.Tensor,
    out: torch.Tensor,
    scale_x: torch.Tensor | None = None,
    scale_w: torch.Tensor | None = None,
) -> Launch:
    """The paired baseline of a grouped task (`registry.baseline_of`): what the `grouped_mm` mode
    times, `torch._grouped_mm(x, w, offs=offs)`, or for fp8 operands (scales given) what the
    `scaled_grouped_mm` mode times, `torch._scaled_grouped_mm(x, w, scale_x, scale_w, offs=offs,
    out_dtype=torch.bfloat16, use_fast_accum=True)`. Its product is a new tensor; `out` stays
    unwritten. torch._grouped_mm runs on CPU tensors too (the tests' providers)."""
    from gluon_survey.baselines import grouped_mm, scaled_grouped_mm
    from gluon_survey.launch import Scales

    target = None
    if x.is_cuda:
        from gluon_survey import api

        target = api.target_of(x.device)
    if scale_x is None and scale_w is None:
        return grouped_mm.prepare(x, w, offs, out, target)
    return scaled_grouped_mm.prepare(x, w, offs, out, target, scales=Scales(scale_x, scale_w, "row"))


def grouped_cublas_product(
    x: torch.Tensor,
    w: torch.Tensor,
    offs: torch.Tensor,
    out: torch.Tensor,
    scale_x: torch.Tensor | None = None,
    scale_w: torch.Tensor | None = None,
) -> torch.Tensor:
    """cuBLAS's grouped product, one `torch.mm` per expert with rows (for fp8 operands with their
    scales, `torch._scaled_mm`), written into `out` (the `cublas-loop` mode's call): the
    tolerance's yardstick on grouped tasks. Runs on CPU tensors too."""
    from gluon_survey.baselines import expert_loop
    from gluon_survey.launch import Scales

    scales = None if scale_x is None and scale_w is None else Scales(scale_x, scale_w, "row")
    expert_loop.prepare(x, w, offs, out, scales=scales).fn()
    return out


@dataclass
class _Target:
    """One input set, its launch, and where its last result is: `out`, or the tensor `fn()`
    returned (the torch.compile baseline returns its product instead of writing `out`)."""

    inputs: Inputs
    out: torch.Tensor
    launch: Launch
    output: torch.Tensor

    @classmethod
    def prepared(cls, provider: Provider, inputs: Inputs, out: torch.Tensor) -> _Target:
        """Prepared and called once: the first call compiles or autotunes, outside any timing."""
        target = cls(inputs, out, provider.prepare(*inputs, out, **inputs.extras), out)
        target.call()
        return target

    def call(self) -> None:
        result = self.launch.fn()
        returned = hasattr(result, "data_ptr") and result.data_ptr() != self.out.data_ptr()
        self.output = result if returned else self.out

    @property
    def timed_call(self) -> Callable[[], object]:
        """The bare launch when it writes `out`; else `call`, which keeps the result to re-check."""
        return self.launch.fn if self.output is self.out else self.call


def measure(
    provider: Provider,
    task: dict[str, Any],
    settings: Settings | dict[str, Any],
    phase: Callable[[str], None],
) -> dict:
    """Check, then time, one task; the row fields the worker knows (see `results.Row`). `settings`
    is a `Settings`, or its JSON (fields it lacks take the defaults)."""
    import torch

    from gluon_survey.driver.check import (
        check,
        grouped_reference,
        make_grouped_inputs,
        make_inputs,
        output_dtype,
        reference,
        rel_error,
    )
    from gluon_survey.driver.shapes import GroupedShape, routing_counts, shape_of
    from gluon_survey.driver.timing import copies_for_cold_l2, time_fn, time_paired

    if not isinstance(settings, Settings):
        settings = Settings.from_json(settings)
    shape = shape_of(*(task.get(k) for k in ("M", "N", "K", "E", "topk", "routing")))
    dtype, layout, seed = task["dtype"], task["b_layout"], settings.seed
    a_layout = task.get("a_layout", "row")
    row: dict[str, Any] = {}
    if isinstance(shape, GroupedShape):
        counts = routing_counts(shape, seed)  # one routing for every input set: the same problem
        row["counts"] = counts

    def input_set(i: int) -> tuple[Inputs | GroupedInputs, torch.Tensor]:
        if isinstance(shape, GroupedShape):
            inputs = make_grouped_inputs(shape, counts, dtype, seed + i, provider.device)
        else:
            inputs = make_inputs(
                shape, dtype, layout, seed + i, provider.device, bias=settings.bias, a_layout=a_layout
            )
        return inputs, torch.empty(shape.M, shape.N, dtype=output_dtype(dtype), device=provider.device)

    phase("compiling/autotuning")
    inputs, out = input_set(0)
    start = time.perf_counter()
    first = _Target.prepared(provider, inputs, out)
    provider.clock.synchronize()
    row.update(compile_s=time.perf_counter() - start, timer=provider.clock.name)
    row["config"] = dict(first.launch.config)  # after the first call: autotuned choices included

    phase("checking")
    if isinstance(shape, GroupedShape):
        ref = grouped_reference(*inputs, **inputs.scales)
        try:
            cublas_out = grouped_cublas_product(*inputs, torch.empty_like(out), **inputs.scales)
        except (RuntimeError, ValueError) as exc:  # e.g. torch._scaled_mm wants K and N it can take
            raise RuntimeError(
                f"cuBLAS per expert, whose error sets the tolerance, cannot run this task: {exc}"
            ) from exc
    else:
        ref = reference(*inputs, **inputs.extras)
        try:
            cublas_out = cublas_product(*inputs, torch.empty_like(out), **inputs.extras)
        except RuntimeError as exc:  # e.g. torch._scaled_mm wants M, N, K that fp8 cuBLAS can take
            raise RuntimeError(
                f"cuBLAS, whose error sets the tolerance, cannot run this task: {exc}"
            ) from exc
    cublas_err = rel_error(cublas_out, ref)
    first.out.fill_(math.nan)
    first.call()
    provider.clock.synchronize()
    verdict = check(first.output, ref, cublas_err, dtype)
    row.update(rel_err=verdict.err, tol=verdict.tol, cublas_err=cublas_err)
    if not verdict.ok:
        return row | {"status": "FAILED", "error": verdict.describe()}

    phase("timing")
    paired = provider.baseline is not None and settings.paired
    outputs = (out, out) if paired else (out,)  # paired: cuBLAS writes an output of its own
    out_bytes = sum(t.numel() * t.element_size() for t in outputs)
    set_bytes = out_bytes + sum(t.numel() * t.element_size() for t in inputs.tensors)
    budget = provider.memory_budget()
    # Enough sets that what the calls touch spans 3x L2, but never more whole sets than the budget
    # holds (a grouped set holds every expert's weight, a call reads only those with rows).
    n_copies = min(
        copies_for_cold_l2(inputs.touched_bytes + out_bytes, provider.l2_bytes, budget),
        max(1, budget // set_bytes),
    )
    targets = [first] + [_Target.prepared(provider, *input_set(i)) for i in range(1, n_copies)]
    for target in targets:
        target.out.fill_(math.nan)

    bounds = {"min_ms": settings.min_ms, "min_iters": settings.min_iters, "max_iters": settings.max_iters}
    launches = [t.timed_call for t in targets]
    if paired:  # cuBLAS on the same inputs, into outputs of its own (ours stay NaN-poisoned)
        cublas = [
            provider.baseline(*t.inputs, torch.empty_like(t.out), **t.inputs.extras).fn  # type: ignore[misc]
            for t in targets
        ]
        with provider.telemetry() as telemetry:
            pair = time_paired(
                lambda i: launches[i],
                lambda i: cublas[i],
                n_copies,
                warmup_ms=settings.warmup_ms,
                rewarm_ms=settings.rewarm_ms,
                settle_ms=settings.settle_ms,
                rounds=settings.rounds,
                noisy_rounds=settings.noisy_rounds,
                queued=settings.queued,
                interleave=settings.interleave,
                interleave_below_ms=settings.interleave_below_ms,
                clock=provider.clock,
                **bounds,
            )
        timing = pair.timing
        row.update(
            cublas_ms=pair.baseline.median_ms, cublas_drift=pair.drift, x_rounds=list(pair.rounds),
            interleaved=pair.interleaved,
        )  # fmt: skip
        if settings.queued:
            row["cublas_starved"] = pair.baseline.starved
        if telemetry is not None:  # each side's clock over its own windows (and their settling)
            ours, theirs = (
                telemetry.result([(a, b) for side, a, b in pair.spans if side in (name, "both")])
                for name in ("kernel", "baseline")
            )
            row.update(ours)
            row.update({f"cublas_{k}": v for k, v in theirs.items()})
    else:
        with provider.telemetry() as telemetry:
            timing = time_fn(
                lambda i: launches[i],
                n_copies,
                warmup_ms=settings.warmup_ms,
                queued=settings.queued,
                clock=provider.clock,
                **bounds,
            )
        if telemetry is not None:
            row.update(telemetry.result())
    if settings.queued:
        row["starved"] = timing.starved
    again = check(first.output, ref, cublas_err, dtype)
    unwritten = sum(int((~torch.isfinite(t.output)).sum().item()) for t in targets[1:])
    if not again.ok or unwritten:
        problem = again.describe() if not again.ok else f"{unwritten} NaN/inf values in rotated outputs"
        return row | {"status": "FAILED", "error": f"wrong after timing: {problem}"}
    return row | {
        "status": "OK",
        "ms_median": timing.median_ms,
        "ms_p20": timing.p20_ms,
        "ms_p80": timing.p80_ms,
        "ms_min": timing.min_ms,
        "spread": timing.spread,
        "n_iters": timing.n,
        "l2_copies": n_copies,
    }


def run_task(
    provider: Provider,
    task: dict[str, Any],
    settings: Settings | dict[str, Any],
    phase: Callable[[str], None],
) -> dict:
    """`measure`, with an unsupported mode, a task of the kind of problem the mode does not compute
    (dense or grouped), a grouped task with per-tensor fp8 scales, an fp8 task of a mode without
    fp8 kernels or in A layout "t", an fp16/bf16 task of a mode that takes fp8 only, a grouped task
    with more token-slots an expert than a decoding mode takes, a dense task with more tokens than a
    few-token mode is timed at, or with a bias a mode that adds none SKIPPED, and an exception turned
    into an ERROR row."""
    if provider.unsupported:
        return {"status": "SKIPPED", "error": provider.unsupported}
    grouped = task.get("E") is not None
    if grouped != provider.grouped:
        kinds = ("dense", "grouped") if provider.grouped else ("grouped", "dense")
        generic = "a {} task; this mode computes {} GEMMs".format(*kinds)
        return {"status": "SKIPPED", "error": provider.wrong_shape or generic}
    if grouped and _scaling(task["dtype"]) == "tensor":
        from gluon_survey.driver.check import GROUPED_FP8

        return {"status": "SKIPPED", "error": GROUPED_FP8}
    if provider.no_fp8 and _is_fp8(task["dtype"]):
        return {"status": "SKIPPED", "error": provider.no_fp8}
    if task.get("a_layout", "row") != "row" and _is_fp8(task["dtype"]):
        from gluon_survey.driver.check import A_T_FP8

        return {"status": "SKIPPED", "error": A_T_FP8}
    if provider.no_16bit and _scaling(task["dtype"]) is None:
        return {"status": "SKIPPED", "error": provider.no_16bit}
    if grouped and (reason := provider.too_many_rows(task["M"] * task["topk"], task["E"])):
        return {"status": "SKIPPED", "error": reason}
    if not grouped and (reason := provider.too_many_tokens(task["M"])):
        return {"status": "SKIPPED", "error": reason}
    with_bias = settings.bias if isinstance(settings, Settings) else settings.get("bias", False)
    if provider.no_bias and with_bias:
        return {"status": "SKIPPED", "error": provider.no_bias}
    try:
        return measure(provider, task, settings, phase)
    except Exception as exc:
        traceback.print_exc()
        return _error_row(exc)
    finally:
        _release_memory(provider.device)


def _is_fp8(dtype: str) -> bool:
    """Whether the task's dtype has fp8 operands (ValueError for an unknown name: an ERROR row)."""
    return _scaling(dtype) not in (None, "unknown")


def _scaling(dtype: str) -> str | None:
    """The task dtype's fp8 scaling ("tensor", "row"), None for fp16/bf16, "unknown" for a name
    that is no dtype (`measure` reports it as an ERROR row)."""
    from gluon_survey.driver.check import dtype_spec

    try:
        return dtype_spec(dtype).scaling
    except ValueError:
        return "unknown"


def _error_row(exc: BaseException) -> dict:
    return {"status": "ERROR", "error": f"{type(exc).__name__}: {exc}"[:ERROR_CHARS]}


def _release_memory(device: str) -> None:
    import gc

    gc.collect()
    if device == "cuda":
        import torch

        with contextlib.suppress(RuntimeError):  # a lost context is reported by `Provider.healthy`
            torch.cuda.empty_cache()


def _protocol_stream() -> IO[str]:
    """A private handle on the original stdout; fd 1 then points at stderr, so that whatever a
    library prints cannot corrupt the JSON lines the parent parses."""
    stream = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return stream


def _exit_when_parent_dies() -> None:
    """The parent holds our stdin open; EOF means it is gone, so is this worker."""

    def watch() -> None:
        sys.stdin.read()
        os._exit(3)

    threading.Thread(target=watch, daemon=True).start()


def main(make_provider: Callable[[str], Provider] = cuda_provider) -> None:
    """Read the job from stdin, measure its tasks with `make_provider(mode)`, write the events."""
    protocol = _protocol_stream()
    job = json.loads(sys.stdin.readline())
    settings = Settings.from_json(job["settings"])
    _exit_when_parent_dies()

    def send(event: str, **fields: object) -> None:
        protocol.write(json.dumps({"event": event, **fields}) + "\n")
        protocol.flush()

    try:
        provider: Provider | None = make_provider(job["mode"])
        broken: dict | None = None
    except Exception as exc:  # the provider cannot even be set up: every task gets the error
        traceback.print_exc()
        provider, broken = None, _error_row(exc)
    for index, task in enumerate(job["tasks"]):
        send("start", task=index)
        if provider is None:
            row = broken
        else:
            row = run_task(provider, task, settings, lambda name, i=index: send("phase", task=i, phase=name))
        send("row", task=index, row=row)
        if provider is not None and row["status"] == "ERROR" and not provider.healthy():
            print("gluon_survey worker: CUDA context lost; exiting for a fresh worker", file=sys.stderr)
            os._exit(4)  # the driver restarts the remaining tasks in a new process
    send("done")


if __name__ == "__main__":
    main()
