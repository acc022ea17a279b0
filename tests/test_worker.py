"""The worker's check-then-time sequence, in process, with CPU providers that misbehave on purpose."""

import itertools
import math
from dataclasses import replace

import pytest
import torch

from gluon_survey.driver.settings import Settings
from gluon_survey.driver.timing import WallClock
from gluon_survey.driver.worker import Provider, measure, run_task
from gluon_survey.launch import Launch

TASK = {"M": 48, "N": 40, "K": 72, "dtype": "fp16", "b_layout": "t"}
SETTINGS = Settings(warmup_ms=1.0, min_ms=2.0, min_iters=5, max_iters=50, paired=False)
PAIRED = replace(SETTINGS, paired=True, noisy_rounds=SETTINGS.rounds)  # no extra rounds: exact counts


def cpu(prepare, unsupported=None, l2_bytes=0, **fields):
    return Provider("cpu", prepare, WallClock(), unsupported, l2_bytes, lambda: 1 << 30, **fields)


def matmul(a, b, out):
    return Launch(lambda: torch.matmul(a, b, out=out))


def _measure(prepare):
    phases = []
    row = measure(cpu(prepare), TASK, SETTINGS, phases.append)
    assert phases[0] == "compiling/autotuning"
    return row, phases


def test_a_correct_launch_is_checked_then_timed():
    row, phases = _measure(lambda a, b, out: Launch(lambda: torch.matmul(a, b, out=out), {"BLOCK_M": 64}))
    assert row["status"] == "OK" and phases == ["compiling/autotuning", "checking", "timing"]
    assert row["rel_err"] <= row["tol"] and row["config"] == {"BLOCK_M": 64}
    assert row["n_iters"] >= 5 and row["ms_p20"] <= row["ms_median"] <= row["ms_p80"]


def test_a_launch_that_returns_its_product_is_judged_on_it():
    row, _ = _measure(lambda a, b, out: Launch(lambda: a @ b))  # leaves `out` alone, as torch.compile does
    assert row["status"] == "OK"


def test_a_wrong_result_is_failed_and_not_timed():
    def prepare(a, b, out):
        return Launch(lambda: out.copy_(a @ b).mul_(1.01))  # 1 % off

    row, phases = _measure(prepare)
    assert row["status"] == "FAILED" and row["error"].startswith("rel_err 0.01 > tol")
    assert "timing" not in phases and "ms_median" not in row


def test_an_unwritten_tile_is_caught_by_the_nan_poisoned_output():
    def prepare(a, b, out):
        return Launch(lambda: out[:, :32].copy_(a @ b[:, :32]))  # skips the last 8 columns

    row, _ = _measure(prepare)
    assert row["status"] == "FAILED" and "NaN/inf values in the output" in row["error"]


def test_a_launch_that_only_works_once_fails_after_timing():
    def prepare(a, b, out):
        calls = []

        def fn():
            if not calls:
                torch.matmul(a, b, out=out)
            calls.append(1)

        return Launch(fn)

    row, _ = _measure(prepare)  # the check's call is its second: already a no-op
    assert row["status"] == "FAILED"

    def prepare_twice(a, b, out):  # correct for the first call and the check, then a no-op
        calls = []

        def fn():
            if len(calls) < 2:
                torch.matmul(a, b, out=out)
            calls.append(1)

        return Launch(fn)

    row, _ = _measure(prepare_twice)
    assert row["status"] == "FAILED" and row["error"].startswith("wrong after timing: rel_err inf")


def test_run_task_turns_exceptions_into_error_rows_and_skips_unsupported(capsys):
    def prepare(a, b, out):
        raise ValueError("no TMA descriptor for this stride")

    assert run_task(cpu(prepare), TASK, SETTINGS, lambda _: None) == {
        "status": "ERROR",
        "error": "ValueError: no TMA descriptor for this stride",
    }
    assert "Traceback" in capsys.readouterr().err
    skipped = run_task(cpu(prepare, unsupported="needs sm_90"), TASK, SETTINGS, lambda _: None)
    assert skipped == {"status": "SKIPPED", "error": "needs sm_90"}


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_non_finite_results_fail(value):
    row, _ = _measure(lambda a, b, out: Launch(lambda: torch.matmul(a, b, out=out).fill_(value)))
    assert row["status"] == "FAILED" and row["rel_err"] == math.inf


def test_paired_baseline_is_timed_around_the_mode_on_the_same_inputs():
    seen = []

    def baseline(a, b, out):
        seen.append((a, b, out))
        return Launch(lambda: torch.matmul(a, b, out=out))

    launches = []

    def prepare(a, b, out):
        launches.append((a, b, out))
        return Launch(lambda: torch.matmul(a, b, out=out))

    provider = cpu(prepare, baseline=baseline)
    row = measure(provider, TASK, PAIRED, lambda _: None)
    assert row["status"] == "OK" and row["cublas_ms"] > 0 and math.isfinite(row["cublas_drift"])
    # the same A and B as the mode's timed sets, but outputs of its own: the mode's stay poisoned
    assert [(a, b) for a, b, _ in seen] == [(a, b) for a, b, _ in launches]
    assert all(o is not out for (_, _, o), (_, _, out) in zip(seen, launches, strict=True))

    unpaired = measure(provider, TASK, SETTINGS, lambda _: None)
    assert "cublas_ms" not in unpaired and "cublas_drift" not in unpaired


def test_paired_baseline_cannot_hide_an_unwritten_output():
    def prepare(a, b, out):  # right on the first input set only
        first = not hasattr(prepare, "done")
        prepare.done = True
        return Launch(lambda: torch.matmul(a, b, out=out) if first else None)

    # a large L2 makes the worker rotate several input sets
    provider = cpu(prepare, l2_bytes=10 << 20, baseline=matmul)
    row = measure(provider, TASK, PAIRED, lambda _: None)
    assert row["status"] == "FAILED" and "NaN/inf values in rotated outputs" in row["error"]


def test_telemetry_result_goes_into_the_row():
    class Fake:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def result(self):
            return {"sm_clock_mhz": 1500.0, "power_w": 650.0}

    provider = cpu(matmul, telemetry=Fake)
    row = measure(provider, TASK, SETTINGS, lambda _: None)
    assert row["sm_clock_mhz"] == 1500.0 and row["power_w"] == 650.0


def test_a_paired_rows_telemetry_is_each_sides_over_its_own_windows():
    """Paired in alternating windows, the row's clock and power are the telemetry over the kernel's
    windows and cublas_sm_clock_mhz / cublas_power_w over cuBLAS's (the fake reads back how many
    windows it was given: `rounds` of the kernel's, one more of cuBLAS's)."""

    class Fake:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def result(self, spans=None):
            assert spans is not None and all(a <= b for a, b in spans)
            return {"sm_clock_mhz": float(len(spans)), "power_w": 600.0 + len(spans)}

    settings = replace(PAIRED, interleave=False, rounds=3, noisy_rounds=3)
    row = measure(cpu(matmul, baseline=matmul, telemetry=Fake), TASK, settings, lambda _: None)
    assert (row["sm_clock_mhz"], row["power_w"]) == (3.0, 603.0)
    assert (row["cublas_sm_clock_mhz"], row["cublas_power_w"]) == (4.0, 604.0)


def test_paired_timing_gets_the_long_warm_up_once_and_the_rounds_asked_for(monkeypatch):
    from gluon_survey.driver import timing

    calls = []
    real = timing.time_paired

    def spy(make_run, make_baseline, n_copies, warmup_ms, rewarm_ms, rounds, **kw):
        calls.append((warmup_ms, rewarm_ms, rounds))
        return real(make_run, make_baseline, n_copies, warmup_ms=0, rewarm_ms=0, rounds=rounds, **kw)

    monkeypatch.setattr(timing, "time_paired", spy)
    provider = cpu(matmul, baseline=matmul)
    settings = replace(PAIRED, warmup_ms=1000.0, rewarm_ms=200.0, rounds=3, noisy_rounds=3)
    row = measure(provider, TASK, settings, lambda _: None)
    assert row["status"] == "OK"
    assert calls == [(1000.0, 200.0, 3)]  # cuBLAS's warm-up, then the mode's short one
    assert len(row["x_rounds"]) == 3 and all(r > 0 for r in row["x_rounds"])


def test_settings_may_come_as_json_with_the_defaults_for_what_is_missing(monkeypatch):
    from gluon_survey.driver import timing

    seen = {}
    real = timing.time_paired

    def spy(make_run, make_baseline, n_copies, **kw):
        seen.update(kw)
        return real(make_run, make_baseline, n_copies, **kw | {"warmup_ms": 0, "rewarm_ms": 0, "min_ms": 1})

    monkeypatch.setattr(timing, "time_paired", spy)
    row = measure(cpu(matmul, baseline=matmul), TASK, {"seed": 1, "max_iters": 50}, lambda _: None)
    defaults = Settings()
    assert row["status"] == "OK"  # paired by default, with the default rounds
    assert (seen["rounds"], seen["noisy_rounds"]) == (defaults.rounds, defaults.noisy_rounds)
    assert defaults.rounds <= len(row["x_rounds"]) <= defaults.noisy_rounds
    assert (seen["warmup_ms"], seen["rewarm_ms"]) == (defaults.warmup_ms, defaults.rewarm_ms)
    assert seen["max_iters"] == 50


def test_gpu_time_reaches_the_timer_and_the_row_counts_the_starved_calls(monkeypatch):
    """`queued` (--gpu-time) goes to the timer, paired or not, and the row carries the starved
    counts the timer returned. On the wall clock there is no queue to keep ahead of: every timed
    call counts, the mode's and cuBLAS's (how many calls each window gets depends on how fast
    the CPU is, so the counts are compared with what the timer returned, not with each other)."""
    from gluon_survey.driver import timing

    seen = []
    for name in ("time_fn", "time_paired"):
        real = getattr(timing, name)

        def spy(*args, real=real, name=name, **kw):
            result = real(*args, **kw)
            seen.append((name, kw["queued"], result))
            return result

        monkeypatch.setattr(timing, name, spy)
    queued = replace(SETTINGS, queued=True)
    row = measure(cpu(matmul), TASK, queued, lambda _: None)
    (_, _, timed) = seen[-1]
    assert row["status"] == "OK" and "cublas_starved" not in row
    assert row["starved"] == timed.starved == timed.n == row["n_iters"] > 0
    paired = measure(cpu(matmul, baseline=matmul), TASK, replace(queued, paired=True), lambda _: None)
    (_, _, pair) = seen[-1]
    assert paired["starved"] == pair.timing.starved == pair.timing.n == paired["n_iters"]
    assert paired["cublas_starved"] == pair.baseline.starved == pair.baseline.n > 0
    per_call = measure(cpu(matmul), TASK, SETTINGS, lambda _: None)
    assert "starved" not in per_call and seen[-1][2].starved == 0
    assert [(name, q) for name, q, _ in seen] == [
        ("time_fn", True),
        ("time_paired", True),
        ("time_fn", False),
    ]


# ------------------------------------------------------------------------------------------------
# fp8 tasks (e4m3 operands, fp32 scales, bf16 out)

FP8_TASKS = [{"M": 48, "N": 40, "K": 96, "dtype": d, "b_layout": "t"} for d in ("fp8", "fp8-row")]


def scaled_mm(a, b, out, scale_a, scale_b):
    return Launch(lambda: torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=out.dtype, out=out))


@pytest.mark.parametrize("task", FP8_TASKS, ids=lambda t: t["dtype"])
def test_an_fp8_task_passes_its_scales_and_is_judged_on_bf16(task):
    seen = []

    def prepare(a, b, out, **scales):
        seen.append((a, b, out, scales))
        return scaled_mm(a, b, out, **scales)

    baselines = []

    def baseline(a, b, out, **scales):
        baselines.append((a, b, scales))
        return scaled_mm(a, b, out, **scales)

    row = measure(cpu(prepare, l2_bytes=1 << 20, baseline=baseline), task, PAIRED, lambda _: None)
    assert row["status"] == "OK" and row["cublas_err"] > 0 and row["rel_err"] <= row["tol"]
    assert row["tol"] == pytest.approx(2 * row["cublas_err"] + 0.25 * 2**-8)  # bf16's roundoff
    assert row["l2_copies"] > 1 and len(seen) == row["l2_copies"]
    for a, b, out, scales in seen:
        assert a.dtype == b.dtype == torch.float8_e4m3fn and b.t().is_contiguous()
        assert out.dtype == torch.bfloat16 and out.shape == (48, 40)
        assert set(scales) == {"scale_a", "scale_b"}
        assert all(s.dtype == torch.float32 for s in scales.values())
        shapes = [tuple(scales["scale_a"].shape), tuple(scales["scale_b"].shape)]
        assert shapes == ([(), ()] if task["dtype"] == "fp8" else [(48, 1), (1, 40)])
    # the paired cuBLAS gets the very same operands and scales
    assert [(a, b) for a, b, _ in baselines] == [(a, b) for a, b, _, _ in seen]
    assert all(x["scale_a"] is y["scale_a"] for (*_, x), (*_, y) in zip(baselines, seen, strict=True))


@pytest.mark.parametrize("task", FP8_TASKS, ids=lambda t: t["dtype"])
def test_an_fp8_kernel_that_drops_a_scale_fails(task):
    def forgets_scale_b(a, b, out, scale_a, scale_b):
        one = torch.ones_like(scale_b)
        return scaled_mm(a, b, out, scale_a, one)

    row = measure(cpu(forgets_scale_b), task, SETTINGS, lambda _: None)
    assert row["status"] == "FAILED" and row["error"].startswith("rel_err")

    def ignores_the_scales(a, b, out, **scales):  # the bare e4m3 product
        return Launch(lambda: out.copy_(a.float() @ b.float()))

    row = measure(cpu(ignores_the_scales), task, SETTINGS, lambda _: None)
    assert row["status"] == "FAILED"


def test_an_fp8_task_of_a_mode_without_fp8_kernels_is_skipped():
    calls = []

    def prepare(a, b, out):  # no scale keywords: it must never see an fp8 task
        calls.append(a.dtype)
        return matmul(a, b, out)

    provider = cpu(prepare, no_fp8="mode 'Blocked' has no fp8 kernel; fp8 operands run in: Pipelined")
    for task in FP8_TASKS:
        row = run_task(provider, task, SETTINGS, lambda _: None)
        assert row == {"status": "SKIPPED", "error": provider.no_fp8}
    assert calls == []
    assert run_task(provider, TASK, SETTINGS, lambda _: None)["status"] == "OK"  # fp16 still runs


def test_the_apis_fp8_type_error_is_an_error_row_not_a_crash():
    def prepare(a, b, out, **scales):  # what api.prepare raises for a mode without fp8 kernels
        raise TypeError("mode 'Blocked' has no fp8 kernel; fp8 operands run in: Pipelined, torch")

    row = run_task(cpu(prepare), FP8_TASKS[0], SETTINGS, lambda _: None)
    assert row["status"] == "ERROR" and row["error"].startswith("TypeError: mode 'Blocked' has no fp8")


def test_cuda_provider_knows_which_modes_take_fp8(monkeypatch):
    from gluon_survey import api, registry
    from gluon_survey.driver.worker import cuda_provider

    monkeypatch.setattr(api, "capability", lambda: None)  # no GPU: nothing is set up
    blocked = cuda_provider("Blocked")
    assert blocked.no_fp8 == (
        f"mode 'Blocked' has no fp8 kernel; fp8 operands run in: {', '.join(registry.fp8_names())}"
    )
    assert cuda_provider("Pipelined").no_fp8 is None and cuda_provider("torch").no_fp8 is None


@pytest.mark.parametrize("task", FP8_TASKS, ids=lambda t: t["dtype"])
def test_the_paired_cublas_launch_is_scaled_mm_into_bf16(task):
    from gluon_survey.driver.check import make_inputs, reference, rel_error
    from gluon_survey.driver.shapes import Shape
    from gluon_survey.driver.worker import _cublas_launch

    inputs = make_inputs(Shape(task["M"], task["N"], task["K"]), task["dtype"], "t", 0, "cpu")
    out = torch.full((task["M"], task["N"]), math.nan, dtype=torch.bfloat16)
    _cublas_launch(inputs.a, inputs.b, out, **inputs.scales).fn()
    expected = torch._scaled_mm(inputs.a, inputs.b, inputs.scale_a, inputs.scale_b, out_dtype=torch.bfloat16)
    assert torch.equal(out, expected)
    assert rel_error(out, reference(*inputs, **inputs.scales)) < 2**-8


# ------------------------------------------------------------------------------------------------
# Grouped tasks: a mixture-of-experts layer's expert GEMMs (shapes.GroupedShape)

GROUPED_TASK = {
    "M": 24 * 2,
    "N": 40,
    "K": 64,
    "E": 6,
    "topk": 2,
    "routing": "half",
    "dtype": "bf16",
    "b_layout": "t",
}


def per_expert(x, w, offs, out):
    from gluon_survey.driver.worker import grouped_cublas_product

    return Launch(lambda: grouped_cublas_product(x, w, offs, out), {"impl": "loop"})


def grouped_cpu(prepare, **fields):
    from gluon_survey.driver.worker import _grouped_baseline_launch

    return cpu(
        prepare,
        grouped=True,
        wrong_shape="a grouped mode",
        **({"baseline": _grouped_baseline_launch} | fields),
    )


def test_a_grouped_task_is_checked_per_expert_then_timed_against_grouped_mm():
    seen = []

    def prepare(x, w, offs, out):
        seen.append((x, w, offs, out))
        return per_expert(x, w, offs, out)

    row = measure(grouped_cpu(prepare), GROUPED_TASK, PAIRED, lambda _: None)
    assert row["status"] == "OK" and row["config"] == {"impl": "loop"}
    assert row["rel_err"] <= row["tol"] and row["cublas_ms"] > 0 and len(row["x_rounds"]) == PAIRED.rounds
    counts = row["counts"]
    assert len(counts) == 6 and sum(counts) == 48 and max(counts) == 24  # half: one expert, half the rows
    x, w, offs, out = seen[0]
    assert (x.shape, w.shape, out.shape, x.dtype) == ((48, 64), (6, 64, 40), (48, 40), torch.bfloat16)
    assert w.transpose(1, 2).is_contiguous() and offs.dtype == torch.int32
    assert offs.tolist() == list(itertools.accumulate(counts))


def test_a_grouped_kernel_that_misses_an_expert_or_a_row_fails():
    def skips_the_busiest(x, w, offs, out):
        ends = offs.tolist()
        busiest = max(range(len(ends)), key=lambda e: ends[e] - (ends[e - 1] if e else 0))
        start = ends[busiest - 1] if busiest else 0

        def fn():
            per_expert(x, w, offs, out).fn()
            out[start : ends[busiest]] = 0

        return Launch(fn)

    def one_row_short(x, w, offs, out):
        return Launch(lambda: (per_expert(x, w, offs, out).fn(), out[-1:].fill_(math.nan)))

    for prepare in (skips_the_busiest, one_row_short):
        row = measure(grouped_cpu(prepare), GROUPED_TASK, SETTINGS, lambda _: None)
        assert row["status"] == "FAILED" and row["rel_err"] > row["tol"], prepare.__name__


def test_a_launch_returning_its_product_is_judged_on_it_grouped_as_dense():
    row = measure(grouped_cpu(lambda x, w, offs, out: Launch(lambda: torch._grouped_mm(x, w, offs=offs))),
                  GROUPED_TASK, SETTINGS, lambda _: None)  # fmt: skip
    assert row["status"] == "OK"


def test_dense_and_grouped_modes_skip_each_others_tasks_and_grouped_per_tensor_fp8():
    def never(*args, **scales):
        raise AssertionError("a skipped task is never prepared")

    dense = cpu(never, wrong_shape="mode 'Blocked' computes dense GEMMs")
    assert run_task(dense, GROUPED_TASK, SETTINGS, lambda _: None) == {
        "status": "SKIPPED",
        "error": "mode 'Blocked' computes dense GEMMs",
    }
    grouped = grouped_cpu(never)
    assert run_task(grouped, TASK, SETTINGS, lambda _: None) == {
        "status": "SKIPPED",
        "error": "a grouped mode",
    }
    fp8 = run_task(grouped, GROUPED_TASK | {"dtype": "fp8"}, SETTINGS, lambda _: None)
    assert fp8["status"] == "SKIPPED" and "row-wise scales only (--dtype fp8-row" in fp8["error"]


def test_an_fp8_only_mode_skips_16_bit_tasks_and_a_16_bit_mode_fp8_ones():
    def never(*args, **scales):
        raise AssertionError("a skipped task is never prepared")

    scaled = grouped_cpu(never, no_16bit="mode 'scaled_grouped_mm' takes fp8 e4m3 operands only")
    row = run_task(scaled, GROUPED_TASK, SETTINGS, lambda _: None)
    assert row == {"status": "SKIPPED", "error": "mode 'scaled_grouped_mm' takes fp8 e4m3 operands only"}
    plain = grouped_cpu(never, no_fp8="mode 'grouped_mm' has no fp8 kernel")
    row = run_task(plain, GROUPED_TASK | {"dtype": "fp8-row"}, SETTINGS, lambda _: None)
    assert row == {"status": "SKIPPED", "error": "mode 'grouped_mm' has no fp8 kernel"}


def test_a_decoding_mode_skips_tasks_with_more_token_slots_an_expert_than_it_is_for():
    def never(*args, **scales):
        raise AssertionError("a skipped task is never prepared")

    seen = []

    def most_one(S, E):
        seen.append((S, E))
        return "too many" if S > E else None

    decoding = grouped_cpu(never, too_many_rows=most_one)
    S, E = GROUPED_TASK["M"] * GROUPED_TASK["topk"], GROUPED_TASK["E"]
    assert S > E and run_task(decoding, GROUPED_TASK, SETTINGS, lambda _: None) == {
        "status": "SKIPPED",
        "error": "too many",
    }
    assert seen == [(S, E)]  # the token-slots are T x top-k
    from gluon_survey.driver.worker import cuda_provider

    assert "at most 2 token-slots an expert" in cuda_provider("grouped-gemv").too_many_rows(17, 8)
    assert cuda_provider("grouped-gemv").too_many_rows(16, 8) is None
    assert cuda_provider("grouped").too_many_rows(10**6, 1) is None


def test_a_few_token_mode_skips_dense_tasks_past_its_tokens():
    def never(*args, **scales):
        raise AssertionError("a skipped task is never prepared")

    seen = []

    def most_32(M):
        seen.append(M)
        return "too many" if M > 32 else None

    few = cpu(never, too_many_tokens=most_32)
    assert run_task(few, TASK, SETTINGS, lambda _: None) == {"status": "SKIPPED", "error": "too many"}
    assert seen == [TASK["M"]]
    from gluon_survey.driver.worker import cuda_provider

    assert "timed at M <= 16 (here 17)" in cuda_provider("gemv").too_many_tokens(17)
    assert cuda_provider("gemv").too_many_tokens(16) is None
    assert cuda_provider("slab").too_many_tokens(65) and cuda_provider("swapab").too_many_tokens(129)
    assert cuda_provider("splitk").too_many_tokens(513) and not cuda_provider("splitk").too_many_tokens(512)
    assert all(cuda_provider(m).too_many_tokens(10**6) is None for m in ("warpspec", "auto", "torch"))


def test_the_cuda_provider_skips_by_the_registry():
    """The real providers' reasons come from the registry (no GPU here: every task is SKIPPED for
    that first, so the reasons are read off the provider)."""
    from gluon_survey.driver.worker import cuda_provider

    assert cuda_provider("scaled_grouped_mm").no_16bit.startswith("mode 'scaled_grouped_mm' takes fp8")
    assert cuda_provider("scaled_grouped_mm").no_fp8 is None
    assert cuda_provider("grouped").no_fp8 is None and cuda_provider("grouped").no_16bit is None
    assert "has no fp8 kernel" in cuda_provider("grouped_mm").no_fp8


FP8_TASK = GROUPED_TASK | {"dtype": "fp8-row", "N": 48}  # N a multiple of 16, as torch._scaled_mm takes


def scaled_per_expert(x, w, offs, out, **scales):
    from gluon_survey.driver.worker import grouped_cublas_product

    return Launch(lambda: grouped_cublas_product(x, w, offs, out, **scales), {"impl": "scaled loop"})


def test_an_fp8_row_grouped_task_takes_its_scales_and_is_checked_against_the_dequantized_product():
    from fakes import grouped_cpu_baseline

    seen = []

    def prepare(x, w, offs, out, **scales):
        seen.append((x, w, offs, out, scales))
        return scaled_per_expert(x, w, offs, out, **scales)

    row = measure(grouped_cpu(prepare, baseline=grouped_cpu_baseline), FP8_TASK, PAIRED, lambda _: None)
    assert row["status"] == "OK" and row["config"] == {"impl": "scaled loop"}, row.get("error")
    assert row["rel_err"] <= row["tol"] and row["cublas_ms"] > 0 and len(row["x_rounds"]) == PAIRED.rounds
    assert row["tol"] == pytest.approx(2 * row["cublas_err"] + 0.25 * 2**-8)  # bf16's roundoff
    x, w, _, out, scales = seen[0]
    assert (x.dtype, w.dtype, out.dtype) == (torch.float8_e4m3fn, torch.float8_e4m3fn, torch.bfloat16)
    assert set(scales) == {"scale_x", "scale_w"}
    assert scales["scale_x"].shape == (48,) and scales["scale_w"].shape == (6, 48)
    assert all(t.dtype == torch.float32 and t.is_contiguous() for t in scales.values())


def test_a_grouped_fp8_kernel_that_drops_a_scale_fails():
    def token_scales_ignored(x, w, offs, out, scale_x, scale_w):
        return scaled_per_expert(x, w, offs, out, scale_x=torch.ones_like(scale_x), scale_w=scale_w)

    def one_expert_unscaled(x, w, offs, out, scale_x, scale_w):
        unscaled = scale_w.clone()
        unscaled[torch.argmax(offs.diff(prepend=offs.new_zeros(1)))] = 1.0  # the busiest expert's
        return scaled_per_expert(x, w, offs, out, scale_x=scale_x, scale_w=unscaled)

    for prepare in (token_scales_ignored, one_expert_unscaled):
        row = measure(grouped_cpu(prepare), FP8_TASK, SETTINGS, lambda _: None)
        assert row["status"] == "FAILED" and row["rel_err"] > row["tol"], prepare.__name__


def test_the_cold_l2_rotation_counts_only_the_experts_a_call_reads():
    """Input sets are made until what the calls touch (x, the weights of experts with rows, the
    outputs) spans 3x L2, not the whole [E, N, K] weight; every set shares the routing."""
    task = GROUPED_TASK | {"M": 1 * 2, "E": 64, "routing": "uniform"}  # one token: 2 of 64 experts read
    sets = []

    def prepare(x, w, offs, out):
        sets.append(offs.tolist())
        return per_expert(x, w, offs, out)

    touched = 2 * 64 * 2 + 2 * 40 * 64 * 2 + 64 * 4 + 2 * 40 * 2  # bytes: x, 2 experts' weights, offs, out
    row = measure(grouped_cpu(prepare, l2_bytes=10 * touched), task, SETTINGS, lambda _: None)
    assert row["status"] == "OK" and row["l2_copies"] == 30 == len(sets)  # 3x L2 / touched
    assert all(ends == sets[0] for ends in sets)  # the whole weight (64 experts) would have made 1 set


# ------------------------------------------------------------------------------------------------
# A in layout "t" (the transpose view of a [K, M] matrix, as in a weight's gradient)

A_T_TASK = TASK | {"a_layout": "t", "b_layout": "row"}


def test_an_a_t_task_hands_every_provider_the_transpose_view_of_a_padded_k_by_m_matrix():
    from gluon_survey.launch import a_layout

    seen = []

    def prepare(a, b, out):
        seen.append(a)
        return matmul(a, b, out)

    baselines = []
    row = measure(
        cpu(prepare, baseline=lambda a, b, out: baselines.append(a) or matmul(a, b, out)),
        A_T_TASK,
        PAIRED,
        lambda _: None,
    )
    assert row["status"] == "OK" and row["rel_err"] <= row["tol"]
    for a in seen + baselines:
        assert a_layout(a) == "t" and tuple(a.shape) == (48, 72)
        assert (a.t().stride(0) * a.element_size()) % 16 == 0  # 48 fp16 rows are 96 bytes: TMA's rule
    # the same values as the row-major A of the same seed: layouts compare like with like
    from gluon_survey.driver.check import make_inputs
    from gluon_survey.driver.shapes import Shape

    row_major = make_inputs(Shape(48, 40, 72), "fp16", "row", SETTINGS.seed, "cpu")
    transposed = make_inputs(Shape(48, 40, 72), "fp16", "row", SETTINGS.seed, "cpu", a_layout="t")
    assert torch.equal(row_major.a, transposed.a) and a_layout(row_major.a) == "row"


def test_an_odd_m_is_padded_to_16_bytes_in_a_layout_t():
    from gluon_survey.driver.check import make_inputs
    from gluon_survey.driver.shapes import Shape

    a = make_inputs(Shape(17, 8, 24), "bf16", "t", 0, "cpu", a_layout="t").a
    assert tuple(a.shape) == (17, 24) and a.stride() == (1, 24)  # [24, 17] rows padded to 24 elements


@pytest.mark.parametrize("dtype", ["fp8", "fp8-row"])
def test_fp8_in_a_layout_t_is_skipped_naming_why(dtype):
    from gluon_survey.driver.check import A_T_FP8, make_inputs
    from gluon_survey.driver.shapes import Shape

    task = FP8_TASKS[0] | {"dtype": dtype, "a_layout": "t"}
    row = run_task(cpu(lambda *a, **k: pytest.fail("prepared")), task, SETTINGS, lambda _: None)
    assert row == {"status": "SKIPPED", "error": A_T_FP8}
    assert "--a-layout row" in A_T_FP8 and "fp8 MMAs read A K-major" in A_T_FP8
    with pytest.raises(ValueError, match="fp8 runs with A layout row only"):
        make_inputs(Shape(16, 16, 32), dtype, "t", 0, "cpu", a_layout="t")


def test_a_mode_that_reads_a_t_in_place_is_timed_as_it_is_and_one_that_copies_pays_the_copy_each_call():
    """`as_matmul_would`: a launch whose config says it reads the transposed A in place (what
    `api.prepare` reports) is kept; otherwise the mode is prepared on a row-major buffer, and each
    call copies A into it first, as `matmul` copies such an A each call."""
    from gluon_survey.driver.check import make_inputs
    from gluon_survey.driver.shapes import Shape
    from gluon_survey.driver.worker import A_COPY, as_matmul_would
    from gluon_survey.launch import a_layout

    a, b = make_inputs(Shape(24, 16, 40), "fp16", "row", 1, "cpu", a_layout="t")
    out = torch.empty(24, 16, dtype=torch.float16)
    got = []

    def in_place(a, b, out):
        got.append(a)
        return Launch(lambda: torch.matmul(a, b, out=out), {"a_layout": "t"})

    launch = as_matmul_would(in_place, a, b, out)
    assert launch.config == {"a_layout": "t"} and [a_layout(x) for x in got] == ["t"]

    got.clear()

    def row_only(a, b, out):
        got.append(a)
        return Launch(lambda: torch.matmul(a, b, out=out), {"BLOCK_M": 64})

    launch = as_matmul_would(row_only, a, b, out)
    assert launch.config == {"BLOCK_M": 64, "a_copy": A_COPY}
    buffer = got[-1]
    assert a_layout(buffer) == "row" and (buffer.stride(0) * 2) % 16 == 0
    a.t().add_(1)  # the caller's A changes between calls (a new gradient each step) ...
    launch.fn()
    assert torch.equal(buffer, a) and torch.allclose(out.float(), a.float() @ b.float(), rtol=1e-2, atol=1e-1)
    # ... and a row-major A is never copied
    row = a.contiguous()
    assert as_matmul_would(row_only, row, b, out).config == {"BLOCK_M": 64}
