"""The one list of modes: the Gluon rungs and the baselines. The CLI, `matmul`, the tests and the
benchmarks all read it.

A mode names a *provider module*. Every provider module defines two functions:

    unsupported_reason(capability: tuple[int, int]) -> str | None
        None when a GPU of this compute capability can run the mode, else why not (one line).

    prepare(a, b, out) -> Launch
        Everything a launch needs that is not the launch itself (descriptors, config choice, grid),
        done once. `a` is [M, K], `b` is [K, N] (row-major, or the transpose view of a contiguous
        [N, K] weight), `out` is [M, N]; all three are CUDA tensors of one dtype (fp16/bf16) that
        `gluon_survey.api` has already validated and made TMA-compatible. `Launch.fn()` writes
        a @ b into `out` (or, for torch.compile only, returns it as a new tensor, because
        writing into `out` would add a copy kernel to every timed call: callers check the
        returned tensor when there is one); its first call may JIT-compile or autotune.

Importing a provider module must not need a GPU, so that `gluon-survey list` and `inspect` work
anywhere.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType


@dataclass(frozen=True)
class Launch:
    """A ready-to-run GEMM: `fn()` computes out = a @ b; `config` is what the tables show."""

    fn: Callable[[], object]
    config: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Mode:
    name: str  # as typed on the command line (matched case-insensitively)
    summary: str  # one line for `gluon-survey list`
    kind: str  # "gluon" (a rung of the ladder) or "baseline"
    archs: tuple[str, ...]  # GPU architectures it supports, for humans: ("sm_90", "sm_100")
    module: str  # provider module, imported lazily

    def load(self) -> ModuleType:
        return importlib.import_module(self.module)

    def unsupported_reason(self, capability: tuple[int, int] | None) -> str | None:
        if capability is None:
            return "no CUDA GPU"
        return self.load().unsupported_reason(capability)


MODES: tuple[Mode, ...] = (
    Mode(
        "Blocked",
        "one output tile per program: TMA loads of A and B tiles, a synchronous MMA, next K step",
        "gluon",
        ("sm_90", "sm_100"),
        "gluon_survey.kernels.blocked",
    ),
    Mode(
        "Pipelined",
        "Blocked + a ring of shared-memory stages: TMA for step k+S-1 in flight while the MMA runs on step k",
        "gluon",
        ("sm_90", "sm_100"),
        "gluon_survey.kernels.pipelined",
    ),
    Mode(
        "persistent",
        "Pipelined + one program per SM over tiles in grouped order; tile i's store overlaps tile i+1",
        "gluon",
        ("sm_90", "sm_100"),
        "gluon_survey.kernels.persistent",
    ),
    Mode(
        "warpspec",
        "persistent + warp specialization: a TMA producer warp, MMA consumers, an epilogue off the MMA path",
        "gluon",
        ("sm_90", "sm_100"),
        "gluon_survey.kernels.warpspec",
    ),
    Mode(
        "triton",
        "plain Triton: persistent, TMA descriptors, grouped tile order, autotuned",
        "baseline",
        ("sm_90", "sm_100", "sm_120"),
        "gluon_survey.baselines.triton_gemm",
    ),
    Mode(
        "torch",
        "torch.matmul, i.e. cuBLAS: the reference every ratio is taken against",
        "baseline",
        ("any CUDA GPU",),
        "gluon_survey.baselines.torch_ops",
    ),
    Mode(
        "torch.compile",
        "torch.compile(torch.matmul, mode='max-autotune-no-cudagraphs')",
        "baseline",
        ("any CUDA GPU",),
        "gluon_survey.baselines.torch_compile",
    ),
)

BASELINE = "torch"
_BY_KEY = {m.name.lower(): m for m in MODES}


def names() -> list[str]:
    return [m.name for m in MODES]


def get(name: str) -> Mode:
    """The mode called `name` (case-insensitive); KeyError listing the valid names otherwise."""
    try:
        return _BY_KEY[name.strip().lower()]
    except KeyError:
        raise KeyError(f"unknown mode {name!r}; valid modes: {', '.join(names())}") from None


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


@dataclass(frozen=True)
class CompileSpec:
    """One kernel + config, as `gluon-survey inspect` compiles it for a GPU it may not have.

    `signature` maps each kernel argument to a Triton type string ("*fp16", "i32", "constexpr",
    "tensordesc<fp16[128, 64],NVMMASharedLayout(...)>"); `constexprs` gives the constexpr values;
    `options` the compile options (num_warps, maxnreg, ...). Provider modules that own kernels
    define `compile_specs(capability: tuple[int, int], dtype: str) -> list[CompileSpec]`.
    """

    mode: str
    kernel: str  # label shown by inspect, e.g. "pipelined_kernel 128x256x64 s3 w8"
    fn: object  # the @gluon.jit or @triton.jit function
    signature: dict[str, str]
    constexprs: dict[str, object]
    options: dict[str, object]
    gluon: bool = True
