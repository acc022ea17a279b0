"""GEMM problem sizes: command-line lists and ranges, the LLM preset and CSV files.

`--m/--n/--k` each take a comma list whose items are integers and inclusive ranges:

    start:stop        doubling: start, 2*start, 4*start, ..., stop (stop must be start * 2**n)
    start:stop:step   arithmetic, CUTLASS-style: start, start+step, ..., up to stop

(`--k 512:16384` is 512, 1024, ..., 16384; `--k 512:16384:512` is 512, 1024, 1536, ...;
`--m 1,16,128:1024:128`). The sweep is their cartesian product. The default is the original
survey's: M = N = 8192, K doubling from 512 to 16384 (`--k 512:16384`).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from itertools import product
from pathlib import Path

DEFAULT_M = "8192"
DEFAULT_N = "8192"
DEFAULT_K = "512:16384"


@dataclass(frozen=True, order=True)
class Shape:
    """out[M, N] = a[M, K] @ b[K, N]."""

    M: int
    N: int
    K: int

    @property
    def label(self) -> str:
        return f"{self.M}x{self.N}x{self.K}"

    @property
    def flops(self) -> int:
        return 2 * self.M * self.N * self.K

    def tflops(self, ms: float) -> float:
        """Throughput in TFLOP/s of one GEMM of this shape taking `ms` milliseconds."""
        return self.flops / (ms * 1e-3) / 1e12


def parse_dim(spec: str, name: str = "k") -> list[int]:
    """'512,1024', '512:4096' (doubling), '512:2048:512' (inclusive stop) or a mix -> sizes, in order,
    duplicates dropped.

    `name` is the option the spec came from, for error messages ("m" -> "--m: ...").
    """
    option = f"--{name.lower()}"
    sizes: list[int] = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        for size in _parse_item(item, f"{option} {item!r}"):
            if size not in sizes:
                sizes.append(size)
    if not sizes:
        raise ValueError(f"{option}: no sizes in {spec!r}")
    return sizes


def _parse_item(item: str, where: str) -> range | list[int]:
    parts = item.split(":")
    if len(parts) == 1:
        return [_positive(item, where)]
    if len(parts) not in (2, 3):
        raise ValueError(f"{where}: expected a size, a start:stop (doubling) or a start:stop:step range")
    start, stop, *step = (_positive(p, where) for p in parts)
    if stop < start:
        raise ValueError(f"{where}: the range stops ({stop}) before it starts ({start})")
    if step:
        return range(start, stop + 1, step[0])
    ratio = stop // start
    if stop % start or ratio & (ratio - 1):
        raise ValueError(
            f"{where}: {stop} is not {start} times a power of 2; a start:stop range doubles "
            f"(use start:stop:step for equal steps)"
        )
    return [start << i for i in range(ratio.bit_length())]


def _positive(text: str, where: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{where}: {text.strip()!r} is not an integer") from None
    if value < 1:
        raise ValueError(f"{where}: {value} must be at least 1")
    return value


def grid(m: str = DEFAULT_M, n: str = DEFAULT_N, k: str = DEFAULT_K) -> list[Shape]:
    """The cartesian product of three `parse_dim` specs, K varying fastest."""
    return [Shape(*mnk) for mnk in product(parse_dim(m, "m"), parse_dim(n, "n"), parse_dim(k, "k"))]


@dataclass(frozen=True)
class _Llama:
    """The fields of a Llama-style decoder's config.json (Qwen2 is one) that fix its linear
    layers' GEMM shapes."""

    name: str
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int = 128

    def linear_nk(self) -> list[tuple[int, int]]:
        """(N, K) of qkv, o, gate_up and down projections, with fused qkv and gate_up weights."""
        qkv = (self.num_attention_heads + 2 * self.num_key_value_heads) * self.head_dim
        return [
            (qkv, self.hidden_size),
            (self.hidden_size, self.num_attention_heads * self.head_dim),
            (2 * self.intermediate_size, self.hidden_size),
            (self.hidden_size, self.intermediate_size),
        ]


# From the models' config.json (meta-llama/Meta-Llama-3-8B and -70B on Hugging Face).
LLAMA3 = (
    _Llama(
        "Llama-3-8B", hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8
    ),
    _Llama(
        "Llama-3-70B",
        hidden_size=8192,
        intermediate_size=28672,
        num_attention_heads=64,
        num_key_value_heads=8,
    ),
)
# Tokens per GEMM: single-token decode, small and large decode batches, prefill chunks.
LLM_TOKENS = (1, 16, 128, 1024, 8192)
# The dense M grid of the `llm-dense` preset: every power of two from 1 to 16384 and the midpoint
# 3 * 2**k between each two (1, 2, 3, 4, 6, 8, 12, ..., 12288, 16384). `matmul`'s default runs a
# Gluon kernel between two measured M only where it beat cuBLAS at both (gluon_survey/choice.py),
# so on this grid no two adjacent measured M from 2 on are more than 1.5x apart.
DENSE_M = tuple(sorted({1 << i for i in range(15)} | {3 << i for i in range(13)}))


def llm_shapes() -> list[Shape]:
    """The linear-layer GEMMs of Llama-3-8B and Llama-3-70B at M = 1, 16, 128, 1024, 8192 tokens.

    With fused projections and head_dim 128 (N = output features, K = input features):

    ==========  ===================  ==================  ====================  ==================
    model       qkv                  o                   gate_up               down
    ==========  ===================  ==================  ====================  ==================
    8B          N=6144  K=4096       N=4096  K=4096      N=28672 K=4096        N=4096  K=14336
    70B         N=10240 K=8192       N=8192  K=8192      N=57344 K=8192        N=8192  K=28672
    ==========  ===================  ==================  ====================  ==================

    qkv N = (num_attention_heads + 2 * num_key_value_heads) * head_dim, gate_up N = 2 *
    intermediate_size, down K = intermediate_size; hidden_size 4096 / 8192, intermediate_size
    14336 / 28672, 32 / 64 query heads and 8 key-value heads, from each model's config.json.
    """
    return _linear_shapes(LLAMA3, LLM_TOKENS)


def llm_dense_shapes() -> list[Shape]:
    """The `llm` preset's weights (`llm_shapes`) at every M of DENSE_M, 28 token counts from 1 to
    16384."""
    return _linear_shapes(LLAMA3, DENSE_M)


def _linear_shapes(models: tuple[_Llama, ...], tokens: tuple[int, ...]) -> list[Shape]:
    """Each model's linear layers (`_Llama.linear_nk`) at each token count, M varying fastest."""
    return [Shape(m, n, k) for model in models for n, k in model.linear_nk() for m in tokens]


# Models whose linear layers the H100 choice table (gluon_survey/tables/h100.json, tuned on the
# `llm` preset) has no entry for: `matmul`'s default meets them through its rule, so the
# `holdout` preset measures how that rule does on weights nobody tuned it for. From each model's
# config.json on Hugging Face (meta-llama/Llama-3.2-1B and -3B, Qwen/Qwen2.5-7B and -14B).
HOLDOUT = (
    _Llama(
        "Llama-3.2-1B",
        hidden_size=2048,
        intermediate_size=8192,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
    ),
    _Llama(
        "Llama-3.2-3B",
        hidden_size=3072,
        intermediate_size=8192,
        num_attention_heads=24,
        num_key_value_heads=8,
    ),
    _Llama(
        "Qwen2.5-7B", hidden_size=3584, intermediate_size=18944, num_attention_heads=28, num_key_value_heads=4
    ),
    _Llama(
        "Qwen2.5-14B",
        hidden_size=5120,
        intermediate_size=13824,
        num_attention_heads=40,
        num_key_value_heads=8,
    ),
)
# Tokens per GEMM in the holdout preset: decode (1, 16, 64), a mid-sized batch and a prefill
# chunk, chosen to fall on both sides of the rule's M thresholds rather than on the table's M.
HOLDOUT_TOKENS = (1, 16, 64, 256, 4096)


def holdout_shapes() -> list[Shape]:
    """The linear-layer GEMMs of Llama-3.2-1B/3B and Qwen2.5-7B/14B at M = 1, 16, 64, 256, 4096.

    ============  ===================  ==================  ====================  ==================
    model         qkv                  o                   gate_up               down
    ============  ===================  ==================  ====================  ==================
    Llama-3.2-1B  N=3072  K=2048       N=2048  K=2048      N=16384 K=2048        N=2048  K=8192
    Llama-3.2-3B  N=5120  K=3072       N=3072  K=3072      N=16384 K=3072        N=3072  K=8192
    Qwen2.5-7B    N=4608  K=3584       N=3584  K=3584      N=37888 K=3584        N=3584  K=18944
    Qwen2.5-14B   N=7168  K=5120       N=5120  K=5120      N=27648 K=5120        N=5120  K=13824
    ============  ===================  ==================  ====================  ==================

    Fused projections as in `llm_shapes`; Llama-3.2-1B has head_dim 64, the others 128.
    """
    return _linear_shapes(HOLDOUT, HOLDOUT_TOKENS)


PRESETS = {"llm": llm_shapes, "llm-dense": llm_dense_shapes, "holdout": holdout_shapes}


def read_csv(path: str | Path) -> list[Shape]:
    """Shapes from a CSV file of M,N,K rows; an optional header row; `#` starts a comment."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"--shapes: cannot read {path}: {exc.strerror}") from None
    shapes: list[Shape] = []
    lines = (line.split("#", 1)[0] for line in text.splitlines())
    for lineno, fields in enumerate(csv.reader(lines), start=1):
        fields = [f.strip() for f in fields]
        if not any(fields):
            continue
        if not shapes and [f.lower() for f in fields] == ["m", "n", "k"]:
            continue
        if len(fields) != 3:
            raise ValueError(
                f"{path}:{lineno}: expected 3 fields M,N,K, got {len(fields)}: {','.join(fields)}"
            )
        shapes.append(Shape(*(_positive(f, f"{path}:{lineno}") for f in fields)))
    if not shapes:
        raise ValueError(f"--shapes: no M,N,K rows in {path}")
    return shapes


def resolve(shapes: str | None, m: str | None, n: str | None, k: str | None) -> list[Shape]:
    """The shapes a command line asks for: `--shapes llm|llm-dense|holdout|FILE.csv`, or the
    `--m/--n/--k` grid."""
    if shapes is None:
        return grid(m or DEFAULT_M, n or DEFAULT_N, k or DEFAULT_K)
    if m or n or k:
        raise ValueError("use either --shapes or --m/--n/--k, not both")
    if shapes in PRESETS:
        return PRESETS[shapes]()
    if shapes.lower().endswith(".csv") or Path(shapes).exists():
        return read_csv(shapes)
    raise ValueError(
        f"--shapes: expected 'llm', 'llm-dense', 'holdout' or a CSV file of M,N,K rows, got {shapes!r}"
    )
