"""The few types every layer shares, in a module that imports nothing of the package: what a
provider is given (`Target`: the GPU it launches on), what it returns (`Launch`), what `inspect`
compiles (`CompileSpec`), the fp8 scales a provider applies (`Scales`), the error a launch made
for aligned bases raises on another (`Unaligned`), and the one vocabulary of B and A layouts.

B layouts, one spelling everywhere (CLI, results, configs, kernel labels, tests):

    "row"  B is a row-major [K, N] matrix.
    "t"    B is the transpose view `w.t()` of a row-major [N, K] weight, as in `x @ w.t()` of a
           linear layer: its tiles are read K-major, with no copy.

`b_layout(b)` is the one function that decides which one a tensor is.

A layouts, the same two words:

    "row"  A is a row-major [M, K] matrix (what every kernel reads).
    "t"    A is the transpose view `x.t()` of a row-major [K, M] matrix, as in a weight's gradient
           grad^T @ x. `gluon_survey.matmul` copies such an A to row-major unless its switch
           `TRANSPOSED_A_IN_PLACE` is on; then the Hopper rungs that take it read its tiles
           M-major from the [K, M] matrix, with no copy (16-bit operands only: fp8 wgmma reads A
           K-major).

`a_layout(a)` decides which one a tensor is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

B_LAYOUTS = ("row", "t")
A_LAYOUTS = ("row", "t")
ALIGN = 16  # bytes: TMA's rule for a base address and a row stride


class Unaligned(ValueError):
    """A launch prepared for ALIGN-byte-aligned base addresses met a tensor whose base is not;
    raised before anything is launched. `gluon_survey.matmul` catches it and runs the plan made
    for that alignment, which copies the tensor into an aligned buffer."""


def b_layout(b) -> str:
    """ "t" when b is the transpose view of a row-major [N, K] weight (unit stride along K, not along
    N), else "row". A [K, N] tensor whose inner stride is 1 is "row" whatever its row stride."""
    return "t" if b.stride(1) != 1 and b.stride(0) == 1 else "row"


def is_kmajor(layout: str) -> bool:
    """Whether tiles of B in this layout are K-major (read from the [N, K] weight)."""
    if layout not in B_LAYOUTS:
        raise ValueError(f"unknown B layout {layout!r}; use one of {', '.join(B_LAYOUTS)}")
    return layout == "t"


def a_layout(a) -> str:
    """ "t" when a is the transpose view of a row-major [K, M] matrix (unit stride along M, not
    along K), else "row". An [M, K] tensor whose inner stride is 1 is "row" whatever its row
    stride (so is one of a single row or column with both strides 1)."""
    return "t" if a.stride(1) != 1 and a.stride(0) == 1 else "row"


def is_a_kmajor(layout: str) -> bool:
    """Whether tiles of A in this layout are K-major (read from the row-major [M, K] matrix)."""
    if layout not in A_LAYOUTS:
        raise ValueError(f"unknown A layout {layout!r}; use one of {', '.join(A_LAYOUTS)}")
    return layout == "row"


@dataclass(frozen=True)
class Target:
    """The GPU a launch is prepared for: compute capability and number of SMs. The API reads them
    off the device once and passes them down, so that kernels never ask torch themselves."""

    capability: tuple[int, int]
    sm_count: int
    name: str = ""  # the device's name, as torch reports it (the choice tables are per GPU)

    @property
    def arch(self) -> str:
        return f"sm_{self.capability[0]}{self.capability[1]}"


SCALINGS = ("tensor", "row")


@dataclass(frozen=True)
class Scales:
    """The dequantization scales of an fp8 product, out = (a @ b) * scale_a * scale_b, applied to
    the fp32 accumulator in the epilogue. `gluon_survey.api` validates them and hands providers
    flat, contiguous fp32 tensors on the operands' GPU:

        kind "tensor"  a and b hold one element each (per-tensor scales);
        kind "row"     a holds M elements (one per row of A: per token) and b holds N (one per
                       column of B: per output channel of the weight).

    `torch_a` / `torch_b` are the same scales in the shapes `torch._scaled_mm` takes: () for
    per-tensor, [M, 1] and [1, N] for row-wise (views, no copy).

    A grouped GEMM's scales (`gluon_survey.grouped`, kind "row" only) are not flat: `a` is the [S]
    token scales and `b` the [E, N] scales of each expert's output channels, as
    `torch._scaled_grouped_mm` takes them (`torch_a` / `torch_b` are for dense products)."""

    a: object  # torch.Tensor, fp32, flat
    b: object
    kind: str

    def __post_init__(self):
        if self.kind not in SCALINGS:
            raise ValueError(f"unknown scaling {self.kind!r}; use one of {', '.join(SCALINGS)}")

    @property
    def code(self) -> int:
        """The kernels' SCALING constexpr: 0 no scales, 1 per-tensor, 2 row-wise."""
        return SCALINGS.index(self.kind) + 1

    @property
    def torch_a(self):
        return self.a.view(()) if self.kind == "tensor" else self.a.view(-1, 1)

    @property
    def torch_b(self):
        return self.b.view(()) if self.kind == "tensor" else self.b.view(1, -1)


@dataclass(frozen=True)
class Launch:
    """A ready-to-run GEMM: `fn()` computes out = a @ b; `config` is what the tables show."""

    fn: Callable[[], object]
    config: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class CompileSpec:
    """One kernel + config, as `gluon-survey inspect` compiles it for a GPU it may not have.

    `signature` maps each kernel argument to a Triton type string ("*fp16", "i32", "constexpr",
    "tensordesc<fp16[128, 64],NVMMASharedLayout(...)>"); `constexprs` gives the constexpr values;
    `options` the compile options (num_warps, maxnreg, ...). Provider modules that own kernels
    define `compile_specs(capability: tuple[int, int], dtype: str) -> list[CompileSpec]`.
    """

    mode: str
    kernel: str  # label shown by inspect, e.g. "pipelined_kernel 128x256x64 s3 w8 B=row"
    fn: object  # the @gluon.jit or @triton.jit function
    signature: dict[str, str]
    constexprs: dict[str, object]
    options: dict[str, object]
    gluon: bool = True
    config: object = None  # the rung's config (GemmConfig), where it has one
    # Arguments a launch specializes as multiples of 16 (pointers: 16-byte aligned), for a kernel
    # that takes pointers and integers rather than descriptors (a GPU-less compile knows nothing
    # of the buffers, and vectorizes only what it is told is aligned).
    divisible: tuple[str, ...] = ()
