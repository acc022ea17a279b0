"""The one list of modes: the Gluon rungs and the baselines. The CLI, `matmul`, the tests and the
benchmarks all read it.

A mode names a *provider module* per GPU architecture (most modes have one module for every GPU
they run on; `warpspec` has a Hopper module and a Blackwell one). Every provider module defines:

    unsupported_reason(capability: tuple[int, int]) -> str | None
        None when a GPU of this compute capability can run the mode, else why not (one line).

    prepare(a, b, out, target: launch.Target) -> launch.Launch
        Everything a launch needs that is not the launch itself (config choice, descriptors,
        grid), done once. `a` is [M, K], `b` is [K, N] (B layout "row"), or the transpose view of
        a [N, K] weight ("t"), `out` is [M, N]; all three are CUDA tensors of one dtype that
        `gluon_survey.api` has already validated and made TMA-compatible; `target` says which GPU
        (capability, SM count). `Launch.fn()` writes a @ b into `out` (or, for torch.compile
        only, returns it as a new tensor, because writing into `out` would add a copy kernel to
        every timed call); its first call may JIT-compile or autotune.

A mode with `fp8=True` also takes fp8 e4m3 operands: its provider's `prepare` then gets a
keyword `scales: launch.Scales` (per-tensor or row-wise dequantization scales, applied to the fp32
accumulator) and an `out` of bf16 or fp16, and B is always the transpose view of an [N, K] weight
(fp8 wgmma reads both operands K-major); without fp8 operands `scales` is None or not passed.

A mode with `grouped=True` computes a grouped GEMM (a mixture-of-experts layer's expert GEMMs in
one call) instead, and its provider's `prepare` is

    prepare(x, w, offs, out, target: launch.Target) -> launch.Launch
        out[rows of e] = x[rows of e] @ w[e] for every expert e: x [S, K] row-major (the tokens
        grouped by expert), w the [E, K, N] transpose view of a contiguous [E, N, K] weight, offs
        int32 [E] cumulative ends on the GPU (torch._grouped_mm's convention), out [S, N]
        row-major, fp16 or bf16, checked by `gluon_survey.grouped.prepare`. As above, `Launch.fn()`
        writes `out` or returns the product (torch._grouped_mm has no `out=`).

A grouped mode with `fp8=True` also takes fp8 e4m3 operands with row-wise scales: its
provider's `prepare` then gets a keyword `scales: launch.Scales` of kind "row" whose `a` is the
[S] token scales and `b` the [E, N] scales of each expert's output channels (contiguous fp32,
torch._scaled_grouped_mm's shapes), and an `out` of bf16 or fp16: out[rows of e] = (x[rows of e]
@ w[e]) * a[row] * b[e, column]. A mode with `sixteen_bit=False` takes fp8 operands only
(`scaled_grouped_mm`: torch._scaled_grouped_mm has no 16-bit form).

Dense and grouped modes never meet the other kind of problem: `matmul` refuses a grouped mode,
`grouped_matmul` and `grouped.prepare` a dense one, and the driver skips such cells
(`wrong_shape_reason`).

A mode with `bias=True` adds a bias in its epilogue: its provider's `prepare` then gets a keyword
`bias` (a contiguous [N] tensor of `out`'s dtype, validated by `gluon_survey.api`), and
`Launch.fn()` writes a @ b + bias (after any fp8 scales); without one `bias` is not passed.

A provider may also define

    reads_transposed_a(a, b, target: launch.Target, fp8: bool = False) -> bool
        Whether its `prepare` reads this `a` in A layout "t" (`launch.a_layout`: the transpose
        view of a row-major [K, M] matrix) in place. `gluon_survey.api` asks only while its
        switch `TRANSPOSED_A_IN_PLACE` is on, and otherwise (and where a provider has no such
        function, or says no) hands every provider a row-major `a`.

and, where it owns kernels, `compile_specs(capability, dtype) -> list[launch.CompileSpec]` for
`gluon-survey inspect`. Importing a provider module must not need a GPU, so that `gluon-survey
list` and `inspect` work anywhere.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType


@dataclass(frozen=True)
class Mode:
    name: str  # as typed on the command line (matched case-insensitively)
    summary: str  # one line for `gluon-survey list`
    kind: str  # "gluon" (a Gluon kernel of ours), "choice" (matmul's or grouped_matmul's default), "baseline"
    archs: tuple[str, ...]  # GPU architectures it supports, for humans: ("sm_90", "sm_100")
    module: str  # provider module, imported lazily
    # Provider modules for particular architectures, by compute-capability major: (10, "...").
    arch_modules: tuple[tuple[int, str], ...] = ()
    fp8: bool = False  # takes fp8 e4m3 operands with scales (module docstring)
    sixteen_bit: bool = True  # takes fp16/bf16 operands (False: fp8 only)
    grouped: bool = False  # a grouped GEMM (mixture-of-experts), not a dense one (module docstring)
    bias: bool = False  # adds a bias in its epilogue (module docstring)
    # A grouped mode for decoding, which reads an expert's weight once per token-slot: the driver
    # times it only where the S token-slots average at most this many an expert (0: at any S).
    rows_an_expert: int = 0
    # A dense mode for few tokens, whose tiles stream the weight once per tile of tokens: the driver
    # and `tune` time it only at M up to this many tokens (0: at any M).
    tokens: int = 0

    def module_for(self, capability: tuple[int, int] | None) -> str:
        """The provider module's name for a GPU of this capability (the default one without a GPU)."""
        if capability is not None:
            for major, module in self.arch_modules:
                if major == capability[0]:
                    return module
        return self.module

    def provider(self, capability: tuple[int, int] | None = None) -> ModuleType:
        """The provider module for a GPU of this capability."""
        return importlib.import_module(self.module_for(capability))

    def unsupported_reason(self, capability: tuple[int, int] | None) -> str | None:
        if capability is None:
            return "no CUDA GPU"
        return self.provider(capability).unsupported_reason(capability)


MODES: tuple[Mode, ...] = (
    Mode(
        "Blocked",
        "one output tile per program: TMA loads of A and B tiles, a synchronous MMA, next K step",
        "gluon",
        ("sm_90", "sm_100"),
        "gluon_survey.kernels.blocked",
        bias=True,
    ),
    Mode(
        "Pipelined",
        "Blocked + a ring of shared-memory stages: TMA for step k+S-1 in flight while the MMA runs on step k",
        "gluon",
        ("sm_90", "sm_100"),
        "gluon_survey.kernels.pipelined",
        fp8=True,
        bias=True,
    ),
    Mode(
        "persistent",
        "Pipelined + one program per SM over its tiles: each tile's prologue and C store overlap "
        "its neighbours' main loops",
        "gluon",
        ("sm_90", "sm_100"),
        "gluon_survey.kernels.persistent",
        fp8=True,
        bias=True,
    ),
    Mode(
        "warpspec",
        "persistent + warp specialization: a TMA producer warp, MMA consumers, an epilogue off the MMA path",
        "gluon",
        ("sm_90", "sm_100"),
        "gluon_survey.kernels.warpspec",
        arch_modules=((10, "gluon_survey.kernels.warpspec_tcgen05"),),
        fp8=True,
        bias=True,
    ),
    Mode(
        "splitk",
        "Pipelined + split-K: a tile's K loop cut over several programs, partials summed in the launch "
        "(few output tiles, deep K)",
        "gluon",
        ("sm_90", "sm_100"),
        "gluon_survey.kernels.splitk",
        fp8=True,
        bias=True,
        tokens=512,
    ),
    Mode(
        "swapab",
        "splitk + swap-AB: C^T = W X^T, so few tokens become the MMA's narrow side (decode)",
        "gluon",
        ("sm_90", "sm_100"),
        "gluon_survey.kernels.swapab",
        fp8=True,
        bias=True,
        tokens=128,
    ),
    Mode(
        "slab",
        "swapab without split-K: mma.sync's 16-row MMA cuts the weight into slabs that fill the GPU, "
        "each summed over its whole K by one program (decode, narrow weights)",
        "gluon",
        ("sm_90", "sm_100"),
        "gluon_survey.kernels.slab",
        fp8=True,
        bias=True,
        tokens=64,
    ),
    Mode(
        "gemv",
        "rung 0's read plus a multiply, for one token: the weight streamed by many small programs with "
        "16-byte loads into registers, CUDA-core FMAs, no tensor core, no shared memory (decode, M = 1)",
        "gluon",
        ("sm_90", "sm_100"),
        "gluon_survey.kernels.gemv",
        fp8=True,
        bias=True,
        tokens=16,
    ),
    Mode(
        "grouped",
        "persistent + a tile list over experts: every expert's GEMM of a mixture-of-experts layer in one "
        "launch, the experts' rows from device-side offsets (grouped shapes: --shapes moe)",
        "gluon",
        ("sm_90", "sm_100"),
        "gluon_survey.kernels.grouped",
        arch_modules=((10, "gluon_survey.kernels.grouped_tcgen05"),),
        fp8=True,
        grouped=True,
    ),
    Mode(
        "grouped-swapab",
        "grouped + swap-AB: C^T = W X^T per expert, so an expert's few tokens are the MMA's narrow side "
        "and 64-row weight tiles fill the GPU (decode)",
        "gluon",
        ("sm_90",),
        "gluon_survey.kernels.grouped_swapab",
        fp8=True,
        grouped=True,
    ),
    Mode(
        "grouped-gemv",
        "grouped + gemv's read, for one token: program (token-slot, 4 weight rows) finds its expert in the "
        "offsets and reads those rows in one chunk of K, as gemv does (fp16/bf16, K <= 16384)",
        "gluon",
        ("sm_90", "sm_100"),
        "gluon_survey.kernels.grouped_gemv",
        grouped=True,
        rows_an_expert=2,
    ),
    Mode(
        "grouped-auto",
        "what grouped_matmul runs: grouped-swapab at decode sizes (S <= grouped_auto.DECODE_ROWS "
        "token-slots), grouped above (on sm_100: grouped at every size)",
        "choice",
        ("sm_90", "sm_100"),
        "gluon_survey.grouped_auto",
        fp8=True,
        grouped=True,
    ),
    Mode(
        "auto",
        "what matmul(kernel=None) runs: per shape, the mode the committed table measured fastest, "
        "or the documented rule",
        "choice",
        ("any CUDA GPU",),
        "gluon_survey.auto",
        fp8=True,
        bias=True,
    ),
    Mode(
        "triton",
        "plain Triton: persistent, TMA descriptors, grouped tile order, autotuned",
        "baseline",
        ("sm_90", "sm_100", "sm_120"),
        "gluon_survey.baselines.triton_gemm",
        fp8=True,
    ),
    Mode(
        "torch",
        "torch.matmul, i.e. cuBLAS: the reference every dense ratio is taken against",
        "baseline",
        ("any CUDA GPU",),
        "gluon_survey.baselines.torch_ops",
        fp8=True,
        bias=True,
    ),
    Mode(
        "torch.compile",
        "torch.compile(torch.matmul, mode='max-autotune-no-cudagraphs'); fp8: of torch._scaled_mm",
        "baseline",
        ("any CUDA GPU",),
        "gluon_survey.baselines.torch_compile",
        fp8=True,
    ),
    Mode(
        "grouped_mm",
        "torch._grouped_mm (CUTLASS for bf16 on sm_90 / sm_100): the reference every grouped fp16/bf16 "
        "ratio is taken against",
        "baseline",
        ("any CUDA GPU",),
        "gluon_survey.baselines.grouped_mm",
        grouped=True,
    ),
    Mode(
        "cublas-loop",
        "torch.mm per expert, i.e. a cuBLAS call for each expert with rows (offsets read to the host once, "
        "when prepared; fp8: torch._scaled_mm per expert)",
        "baseline",
        ("any CUDA GPU",),
        "gluon_survey.baselines.expert_loop",
        fp8=True,
        grouped=True,
    ),
    Mode(
        "scaled_grouped_mm",
        "torch._scaled_grouped_mm (fp8 e4m3, row-wise scales, bf16 out; CUTLASS on sm_90 / sm_100): the "
        "reference every grouped fp8 ratio is taken against",
        "baseline",
        ("sm_90 or sm_100 (torch's kernel)",),  # no kernel of ours: `inspect` targets none for it
        "gluon_survey.baselines.scaled_grouped_mm",
        fp8=True,
        grouped=True,
        sixteen_bit=False,
    ),
)

BASELINE = "torch"  # the reference of dense rows
GROUPED_BASELINE = "grouped_mm"  # the reference of grouped fp16/bf16 rows
GROUPED_FP8_BASELINE = "scaled_grouped_mm"  # the reference of grouped fp8 rows (row-wise scales)


def names() -> list[str]:
    return [m.name for m in MODES]


def get(name: str) -> Mode:
    """The mode called `name` (case-insensitive); KeyError listing the valid names otherwise."""
    key = name.strip().lower()
    for mode in MODES:
        if mode.name.lower() == key:
            return mode
    raise KeyError(f"unknown mode {name!r}; valid modes: {', '.join(names())}")


def parse_modes(spec: str | None) -> list[Mode]:
    """'Blocked,triton,torch' -> modes, in the order given; None or '' -> every mode."""
    if not spec:
        return list(MODES)
    out: list[Mode] = []
    for part in spec.split(","):
        if part.strip():
            mode = get(part)
            if mode not in out:
                out.append(mode)
    return out


def fp8_names(grouped: bool = False) -> list[str]:
    """The modes that take fp8 operands, of the dense ones (or the grouped ones)."""
    return [m.name for m in MODES if m.fp8 and m.grouped == grouped]


def bias_names() -> list[str]:
    return [m.name for m in MODES if m.bias]


def no_bias_reason(mode: Mode) -> str | None:
    """Why `mode` cannot take a bias, None when it can (one wording for `matmul` and the CLI)."""
    if mode.bias:
        return None
    return f"mode {mode.name!r} adds no bias in its epilogue; a bias runs in: {', '.join(bias_names())}"


def no_fp8_reason(mode: Mode) -> str | None:
    """Why `mode` cannot take fp8 operands, None when it can: one wording for `matmul`, the CLI
    and the worker."""
    if mode.fp8:
        return None
    return f"mode {mode.name!r} has no fp8 kernel; fp8 operands run in: {', '.join(fp8_names(mode.grouped))}"


def too_many_rows_reason(mode: Mode, S: int, E: int) -> str | None:
    """Why the driver does not time grouped `mode` on S token-slots over E experts (`rows_an_expert`),
    None where it does."""
    most = mode.rows_an_expert * E
    if not most or most >= S:
        return None
    return (
        f"mode {mode.name!r} is for decoding, at most {mode.rows_an_expert} token-slots an expert on "
        f"average (here {S} over {E} experts): it reads an expert's weight once per slot"
    )


def too_many_tokens_reason(mode: Mode, M: int) -> str | None:
    """Why the driver does not time dense `mode` at M tokens (`tokens`), None where it does."""
    if not mode.tokens or mode.tokens >= M:
        return None
    return (
        f"mode {mode.name!r} is for few tokens, timed at M <= {mode.tokens} (here {M}): its tiles "
        "stream the weight once per tile of tokens"
    )


def no_16bit_reason(mode: Mode) -> str | None:
    """Why `mode` cannot take fp16/bf16 operands, None when it can (one wording for
    `grouped.prepare`, the CLI and the worker)."""
    if mode.sixteen_bit:
        return None
    others = ", ".join(m.name for m in MODES if m.sixteen_bit and m.grouped == mode.grouped)
    return f"mode {mode.name!r} takes fp8 e4m3 operands only; fp16 and bf16 operands run in: {others}"


def baseline_of(grouped: bool, fp8: bool = False) -> str:
    """The mode every row's ratio is taken against: cuBLAS for dense rows, torch._grouped_mm for
    grouped fp16/bf16 ones, torch._scaled_grouped_mm for grouped fp8 ones."""
    if not grouped:
        return BASELINE
    return GROUPED_FP8_BASELINE if fp8 else GROUPED_BASELINE


def baselines() -> frozenset[str]:
    """Every mode that is a row's reference for some kind of problem and dtype (`baseline_of`)."""
    return frozenset(baseline_of(grouped, fp8) for grouped in (False, True) for fp8 in (False, True))


def modes_of(grouped: bool) -> list[Mode]:
    """The modes that compute dense GEMMs (grouped False) or grouped ones, in registry order."""
    return [m for m in MODES if m.grouped == grouped]


def wrong_shape_reason(mode: Mode, grouped: bool) -> str | None:
    """Why `mode` cannot take a problem of this kind (grouped or dense), None when it can: one
    wording for `matmul`, `grouped_matmul`, the CLI and the worker."""
    if mode.grouped == grouped:
        return None
    others = ", ".join(m.name for m in modes_of(grouped))
    if grouped:
        return (
            f"mode {mode.name!r} computes dense GEMMs; grouped (mixture-of-experts) problems run in: {others}"
        )
    return f"mode {mode.name!r} computes grouped (mixture-of-experts) GEMMs; dense problems run in: {others}"


def supported_summary() -> str:
    """Which GPUs run which modes, in one line (for errors on a machine that runs none)."""
    by_archs: dict[tuple[str, ...], list[str]] = {}
    for mode in MODES:
        by_archs.setdefault(mode.archs, []).append(mode.name)
    return "; ".join(f"{', '.join(ms)} on {' / '.join(archs)}" for archs, ms in by_archs.items())
