"""GEMM problem sizes: command-line lists and ranges, the LLM presets, the mixture-of-experts
preset (grouped GEMMs) and CSV files.

`--m/--n/--k` each take a comma list whose items are integers and inclusive ranges:

    start:stop        doubling: start, 2*start, 4*start, ..., stop (stop must be start * 2**n)
    start:stop:step   arithmetic, CUTLASS-style: start, start+step, ..., up to stop

(`--k 512:16384` is 512, 1024, ..., 16384; `--k 512:16384:512` is 512, 1024, 1536, ...;
`--m 1,16,128:1024:128`). The sweep is their cartesian product. The default is the original
survey's: M = N = 8192, K doubling from 512 to 16384 (`--k 512:16384`).

A dense problem is a `Shape` (M, N, K). A grouped one, a mixture-of-experts layer's expert GEMMs
in one call, is a `GroupedShape`: T tokens each routed to top-k of E experts, so x has S = T * topk
rows grouped by expert, each expert's rows times its own [K, N] weight. How many of the S rows
each expert gets is the routing's (`routing_counts`: uniform, zipf or half, drawn from the run's
seed); `--shapes moe` is four models' expert GEMMs at six token counts in each routing.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from itertools import product
from pathlib import Path

DEFAULT_M = "8192"
DEFAULT_N = "8192"
DEFAULT_K = "512:16384"


class _Work:
    """The arithmetic of a GEMM of M x N x K (a grouped one: M is its S rows), for a shape class
    with M, N and K."""

    @property
    def flops(self) -> int:
        return 2 * self.M * self.N * self.K

    def tflops(self, ms: float) -> float:
        """Throughput in TFLOP/s of one GEMM of this shape taking `ms` milliseconds."""
        return self.flops / (ms * 1e-3) / 1e12


@dataclass(frozen=True, order=True)
class Shape(_Work):
    """out[M, N] = a[M, K] @ b[K, N].

    `a_layout` and `b_layout` (`gluon_survey.launch.A_LAYOUTS` / `B_LAYOUTS`) are the layouts a
    preset measures this product in, where it fixes them (`llm_train_shapes`: a training step's
    products, each in its own pair); None: the command's --a-layout / --b-layout. A results row's
    shape has none (the row carries its layouts)."""

    M: int
    N: int
    K: int
    a_layout: str | None = None
    b_layout: str | None = None

    @property
    def label(self) -> str:
        return f"{self.M}x{self.N}x{self.K}"

    @property
    def tokens(self) -> int:
        """The tokens of a linear layer computing this GEMM: M."""
        return self.M

    @property
    def weight(self) -> str:
        """The weight's label, N x K: what the rows of one line of a plot against tokens share."""
        return f"{self.N}x{self.K}"

    def to_json(self) -> dict[str, int]:
        """The fields a task and a results row carry: M, N, K (the layouts go on the task's own)."""
        return {"M": self.M, "N": self.N, "K": self.K}

    @property
    def fixed_layouts(self) -> bool:
        """Whether the shape says which layouts it is measured in (`a_layout`, `b_layout`)."""
        return self.a_layout is not None or self.b_layout is not None


ROUTINGS = ("uniform", "zipf", "half")
ZIPF_EXPONENT = 1.0  # zipf routing: expert of rank r (1-based) is picked with weight 1 / r**ZIPF_EXPONENT


@dataclass(frozen=True, order=True)
class GroupedShape(_Work):
    """A mixture-of-experts layer's expert GEMMs in one call: T tokens, each routed to `topk` of
    `E` experts, give x [S, K] with S = T * topk rows grouped by expert; expert e's rows times its
    weight [K, N] (the transpose view of an [N, K] slice of the [E, N, K] weight). How the S rows
    split over the experts is `routing` (one of ROUTINGS; `routing_counts`)."""

    T: int
    N: int
    K: int
    E: int
    topk: int
    routing: str

    def __post_init__(self) -> None:
        for name in ("T", "N", "K", "E", "topk"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} = {getattr(self, name)} must be at least 1")
        if self.topk > self.E:
            raise ValueError(f"topk = {self.topk} is more than the E = {self.E} experts a token picks from")
        if self.routing not in ROUTINGS:
            raise ValueError(f"unknown routing {self.routing!r}; use one of {', '.join(ROUTINGS)}")

    @property
    def M(self) -> int:
        """x's rows: S = T * topk token-slots."""
        return self.T * self.topk

    @property
    def label(self) -> str:
        return f"{self.N}x{self.K} E={self.E} top-{self.topk} T={self.T} {self.routing}"

    @property
    def tokens(self) -> int:
        """The layer's tokens: T (each is `topk` of x's rows)."""
        return self.T

    @property
    def weight(self) -> str:
        """The experts' weight and the routing, what the rows of one line of a plot against T share."""
        return f"{self.N}x{self.K} E={self.E} top-{self.topk} {self.routing}"

    fixed_layouts = False  # the grouped sweep's layouts are its own (B t, A row)

    def to_json(self) -> dict[str, int | str]:
        """The fields a task and a results row carry: M (= S), N, K, E, topk, routing."""
        return {
            "M": self.M,
            "N": self.N,
            "K": self.K,
            "E": self.E,
            "topk": self.topk,
            "routing": self.routing,
        }


def shape_of(
    M: int, N: int, K: int, E: int | None = None, topk: int | None = None, routing: str | None = None
) -> Shape | GroupedShape:
    """The shape a task or a results row describes (`to_json`'s fields): grouped when it names E."""
    if E is None:
        return Shape(M, N, K)
    if topk is None or routing is None or M % topk:
        raise ValueError(
            f"a grouped shape needs topk dividing M = S and a routing; got topk {topk}, {routing}"
        )
    return GroupedShape(M // topk, N, K, E, topk, routing)


def routing_counts(shape: GroupedShape, seed: int) -> list[int]:
    """How many of the S = T * topk rows each of the E experts gets: non-negative, summing to S,
    the same for the same (shape's E, topk, T and routing, seed), whatever N and K (a layer's
    gate_up and down GEMMs see the same routing). Experts may get none.

    uniform  each token picks `topk` distinct experts, every expert equally likely, as a router's
             top-k of random logits would
    zipf     each token picks `topk` distinct experts, expert of rank r weighted 1 / r**ZIPF_EXPONENT,
             the ranks a seeded permutation of the experts (the popular ones are not always the
             first)
    half     a seeded expert takes S // 2 of the token-slots, the others the rest, drawn uniformly
             slot by slot: with topk > 2 a token would have to pick that expert several times, so
             this is the load imbalance itself, not a router's output

    Drawn with numpy's PCG64 from `seed` (the run's `--seed`, any integer) and the shape's E, topk,
    T and routing."""
    import numpy as np

    rng = np.random.Generator(
        np.random.PCG64([seed % 2**64, shape.E, shape.topk, shape.T, ROUTINGS.index(shape.routing)])
    )
    E, S = shape.E, shape.M
    counts = np.zeros(E, dtype=np.int64)
    if shape.routing == "half":
        hot = int(rng.integers(E))
        counts[hot] = S // 2
        rest = S - S // 2
        if E == 1:
            counts[hot] += rest
        else:
            others = np.delete(np.arange(E), hot)
            np.add.at(counts, others[rng.integers(E - 1, size=rest)], 1)
        return counts.tolist()
    weights = np.ones(E)
    if shape.routing == "zipf":
        weights[rng.permutation(E)] = 1.0 / np.arange(1, E + 1) ** ZIPF_EXPONENT
    # Top-k without replacement per token: the k largest of log(weight) + Gumbel noise.
    keys = np.log(weights) + rng.gumbel(size=(shape.T, E))
    picked = np.argpartition(-keys, shape.topk - 1, axis=1)[:, : shape.topk]
    np.add.at(counts, picked.ravel(), 1)
    return counts.tolist()


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


# Tokens per training step's GEMM in the `llm-train` preset: a micro-batch's tokens (sequences of
# 1024 to 8192 tokens, or several shorter ones packed).
TRAIN_TOKENS = (1024, 2048, 4096, 8192)


def llm_train_shapes() -> list[Shape]:
    """The backward products of the `llm` preset's weights (`llm_shapes`) at T = 1024, 2048, 4096,
    8192 tokens, each in the layouts a training step has. For a weight W [N, K] (y = x @ W^T) and
    the gradient grad [T, N] of its output:

        grad_x    = grad [T, N] @ W [N, K]       M = T, N = K, K = N   A row, B row
        grad_W^T  = grad^T [N, T] @ x [T, K]     M = N, N = K, K = T   A t (grad's transpose view), B row

    (the forward product x @ W^T is the `llm` preset's, B t). Per weight and T the two products in
    turn, T varying fastest; 64 shapes."""
    out = []
    for model in LLAMA3:
        for n, k in model.linear_nk():
            for t in TRAIN_TOKENS:
                out += [Shape(t, k, n, "row", "row"), Shape(n, k, t, "t", "row")]
    return out


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


@dataclass(frozen=True)
class _MoE:
    """The fields of a mixture-of-experts model's config.json that fix its expert GEMMs (the
    routed experts; shared experts and attention are dense layers)."""

    name: str
    experts: int  # num_local_experts / num_experts / n_routed_experts
    topk: int  # num_experts_per_tok / experts_per_token
    hidden_size: int
    intermediate_size: int  # per expert: moe_intermediate_size where the config has one

    def expert_nk(self) -> list[tuple[int, int]]:
        """(N, K) of the fused gate_up projection (N = 2 I, K = H) and of down (N = H, K = I)."""
        return [(2 * self.intermediate_size, self.hidden_size), (self.hidden_size, self.intermediate_size)]


# From each model's config.json on Hugging Face (mistralai/Mixtral-8x7B-v0.1, Qwen/Qwen3-30B-A3B,
# deepseek-ai/DeepSeek-V3, openai/gpt-oss-20b).
MOE_MODELS = (
    _MoE("Mixtral-8x7B", experts=8, topk=2, hidden_size=4096, intermediate_size=14336),
    _MoE("Qwen3-30B-A3B", experts=128, topk=8, hidden_size=2048, intermediate_size=768),
    _MoE("DeepSeek-V3", experts=256, topk=8, hidden_size=7168, intermediate_size=2048),
    _MoE("GPT-OSS-20B", experts=32, topk=4, hidden_size=2880, intermediate_size=2880),
)
# Tokens per layer call (T; the grouped GEMM has T * topk rows): decode batches, prefill chunks.
MOE_TOKENS = (1, 16, 64, 512, 4096, 16384)


def moe_shapes() -> list[GroupedShape]:
    """The expert GEMMs of Mixtral-8x7B, Qwen3-30B-A3B, DeepSeek-V3 and GPT-OSS-20B at T = 1, 16,
    64, 512, 4096, 16384 tokens, in each routing (ROUTINGS), T varying fastest:

    =============  ===  =====  =====================  ====================
    model          E    top-k  gate_up                down
    =============  ===  =====  =====================  ====================
    Mixtral-8x7B   8    2      N=28672 K=4096         N=4096  K=14336
    Qwen3-30B-A3B  128  8      N=1536  K=2048         N=2048  K=768
    DeepSeek-V3    256  8      N=4096  K=7168         N=7168  K=2048
    GPT-OSS-20B    32   4      N=5760  K=2880         N=2880  K=2880
    =============  ===  =====  =====================  ====================

    gate_up N = 2 * intermediate size (per expert), K = hidden size; down the reverse. 144 shapes.
    """
    return [
        GroupedShape(t, n, k, model.experts, model.topk, routing)
        for model in MOE_MODELS
        for n, k in model.expert_nk()
        for routing in ROUTINGS
        for t in MOE_TOKENS
    ]


PRESETS = {
    "llm": llm_shapes,
    "llm-dense": llm_dense_shapes,
    "llm-train": llm_train_shapes,
    "holdout": holdout_shapes,
    "moe": moe_shapes,
}
GROUPED_CSV_HEADER = ["t", "n", "k", "e", "topk", "routing"]  # a CSV of grouped shapes, lower-cased


def read_csv(path: str | Path) -> list[Shape] | list[GroupedShape]:
    """Shapes from a CSV file: dense M,N,K rows, or grouped T,N,K,E,topk,routing rows (T tokens,
    E experts, topk of them per token, routing one of ROUTINGS), not both in one file; an optional
    header row; `#` starts a comment."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"--shapes: cannot read {path}: {exc.strerror}") from None
    shapes: list = []
    width = None  # 3 (dense) or 6 (grouped): the first row's
    lines = (line.split("#", 1)[0] for line in text.splitlines())
    for lineno, fields in enumerate(csv.reader(lines), start=1):
        fields = [f.strip() for f in fields]
        if not any(fields):
            continue
        where = f"{path}:{lineno}"
        if not shapes and [f.lower() for f in fields] in (["m", "n", "k"], GROUPED_CSV_HEADER):
            width = len(fields)
            continue
        if len(fields) not in (3, 6) or (width is not None and len(fields) != width):
            expected = {3: "3 fields M,N,K", 6: "6 fields T,N,K,E,topk,routing"}
            wanted = expected[width] if width else f"{expected[3]} or {expected[6]}"
            raise ValueError(f"{where}: expected {wanted}, got {len(fields)}: {','.join(fields)}")
        width = len(fields)
        if width == 3:
            shapes.append(Shape(*(_positive(f, where) for f in fields)))
            continue
        *sizes, routing = fields
        try:
            shapes.append(GroupedShape(*(_positive(f, where) for f in sizes), routing.lower()))
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    if not shapes:
        raise ValueError(f"--shapes: no M,N,K or T,N,K,E,topk,routing rows in {path}")
    return shapes


def fixed_layouts(shapes: list[Shape] | list[GroupedShape]) -> bool:
    """Whether a sweep's shapes say which layouts each is measured in (`Shape.fixed_layouts`)."""
    return any(s.fixed_layouts for s in shapes)


def is_grouped(shapes: list[Shape] | list[GroupedShape]) -> bool:
    """Whether a sweep's shapes are grouped (each sweep is one kind: `resolve` makes it so)."""
    return any(isinstance(s, GroupedShape) for s in shapes)


def resolve(
    shapes: str | None, m: str | None, n: str | None, k: str | None
) -> list[Shape] | list[GroupedShape]:
    """The shapes a command line asks for: `--shapes llm|llm-dense|llm-train|holdout|moe|FILE.csv`,
    or the `--m/--n/--k` grid."""
    if shapes is None:
        return grid(m or DEFAULT_M, n or DEFAULT_N, k or DEFAULT_K)
    if m or n or k:
        raise ValueError("use either --shapes or --m/--n/--k, not both")
    if shapes in PRESETS:
        return PRESETS[shapes]()
    if shapes.lower().endswith(".csv") or Path(shapes).exists():
        return read_csv(shapes)
    raise ValueError(
        f"--shapes: expected 'llm', 'llm-dense', 'llm-train', 'holdout', 'moe' or a CSV file of M,N,K (or "
        f"T,N,K,E,topk,routing) rows, got {shapes!r}"
    )
