"""`gluon_survey::grouped_mm`: `grouped_matmul` as a PyTorch operator, with a fake implementation
and gradients; `route`, the sort by expert and the offsets that a mixture-of-experts layer feeds it.

    out = torch.ops.gluon_survey.grouped_mm(x, w, offs)   # out[rows of e] = x[rows of e] @ w[e]

The arguments are `grouped_matmul`'s (no `out`): x [S, K] tokens grouped by expert, w the [E, K, N]
transpose view of a contiguous [E, N, K] weight, offs int32 [E] cumulative ends on the GPU. The
operator is what torch.compile (`fullgraph=True` too), torch.export and autograd see: one opaque
node whose output a fake implementation describes. The fake implementation runs grouped_matmul's
argument checks, so bad arguments fail when a function is traced, not when compiled code first
runs. The rows at or past offs[-1], which no expert owns, are left unwritten (as
`torch._grouped_mm` leaves them); their gradient is zero.

Gradients. The forward runs on the survey's grouped kernel; both backward products run on
`torch._grouped_mm` (PyTorch's grouped GEMM), not on the survey's kernels:

    grad_x[rows of e] = grad[rows of e] @ w[e]^T    torch._grouped_mm(grad, w.transpose(1, 2), offs)
    grad_w[e] = x[rows of e]^T @ grad[rows of e]    torch._grouped_mm(grad.t(), x, offs)

* grad_x: the survey's kernel reads B as the transpose view of a contiguous [E, N', K'] weight.
  w[e]^T, as B, is [K' = N, N' = K], and what holds it contiguously is the weight itself,
  [E, N, K] = [E, K', N']: the one layout the kernel refuses. Running it there would copy every
  expert's weight (E * N * K elements) on every backward; torch._grouped_mm reads the weight where
  it is.
* grad_w is a grouped GEMM over the tokens (each expert's K is its token count), which the survey
  has no kernel for. torch._grouped_mm writes it as a contiguous [E, N, K] tensor, the weight's own
  layout, and the operator returns its [E, K, N] transpose view: the layout of the w passed in, so
  a weight Parameter's gradient is row-major like the Parameter.

Costs besides the two products: grad is made contiguous (a copy only where it is not), and grad_x's
rows at or past offs[-1] are zeroed (one pass over grad_x). Neither reads anything to the host.
Gradients need what torch._grouped_mm needs: bf16 (the dtype its fake implementation, which
torch.compile traces, accepts) and N a multiple of 8 (grad's rows in 16-byte multiples). Both are
checked when autograd records the call, before the GPU, with a TypeError or ValueError that says
so; the forward alone also takes fp16 and any N.

`gluon_survey::grouped_swiglu` is `grouped_swiglu` (the gate-and-up projection with SwiGLU fused
into the kernel's epilogue, out [S, I]) the same way, for inference only: it has a fake
implementation (its checks) but no gradients, and a call that autograd would record is refused
(`gluon_survey.experts` calls it only where no gradient is wanted).

    out = torch.ops.gluon_survey.grouped_swiglu(x, w, offs)   # silu(h[:, :I]) * h[:, I:], h = x @ w[e]

Importing this module registers the operators; `import gluon_survey` does not import it until
`gluon_survey.moe` is first used (`gluon_survey.experts` imports it).
"""

from __future__ import annotations

import torch

from . import api, grouped
from .kernels import routed

GRAD_DTYPE = torch.bfloat16  # torch._grouped_mm's dtype when traced (its fake implementation's check)
GRAD_N = 8  # N a multiple of 8: grad [S, N] in rows of 16-byte multiples, as torch._grouped_mm needs

__all__ = ["grouped_mm", "grouped_swiglu", "route", "routed_experts"]


@torch.library.custom_op("gluon_survey::grouped_mm", mutates_args=())
def _grouped_mm(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    if x.is_cuda:
        # as in ops.py: the operator may run on a thread with no current CUDA context (autograd's),
        # and TMA descriptors are encoded through the driver API, which needs one
        torch.cuda.set_device(x.device)
    return grouped.grouped_matmul(x, w, offs)


@_grouped_mm.register_fake
def _grouped_mm_fake(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    if isinstance(offs, torch.Tensor) and offs.device.type == "cpu":
        # grouped_matmul reads a CPU offs's last value, which a traced tensor does not have: the
        # error it comes to anyway, that offs must be on the GPU, first
        api.require_cuda("offs", offs)
    S, N = grouped._check(x, w, offs, None)
    return x.new_empty((S, N))


def _setup_context(ctx, inputs, output) -> None:
    """Runs where autograd records the call: the gradients' own limits are checked here, before
    the GPU, rather than in the backward."""
    x, w, offs = inputs
    if x.dtype != GRAD_DTYPE:
        raise TypeError(
            f"gradients of gluon_survey::grouped_mm are computed by torch._grouped_mm, which takes "
            f"{GRAD_DTYPE} when traced; x and w are {x.dtype}: train in bfloat16, or run the forward "
            "without gradients (torch.no_grad())"
        )
    if w.shape[2] % GRAD_N:
        raise ValueError(
            f"gradients of gluon_survey::grouped_mm need N (w.shape[2] = {w.shape[2]}) a multiple of "
            f"{GRAD_N}: torch._grouped_mm, which computes them, reads the gradient in rows of 16-byte "
            f"multiples; pad N to a multiple of {GRAD_N}"
        )
    ctx.save_for_backward(x, w, offs)


def _backward(ctx, grad: torch.Tensor):
    x, w, offs = ctx.saved_tensors
    S, K = x.shape
    E, _, N = w.shape
    grad = grad.contiguous()
    grad_x = grad_w = None
    empty = S == 0 or N == 0 or K == 0  # nothing to multiply: zero gradients
    if ctx.needs_input_grad[0]:
        if empty:
            grad_x = torch.zeros_like(x)
        else:
            grad_x = torch._grouped_mm(grad, w.transpose(1, 2), offs=offs)
            unowned = torch.arange(S, device=x.device) >= offs[-1]  # rows no expert owns
            grad_x.masked_fill_(unowned.unsqueeze(1), 0)
    if ctx.needs_input_grad[1]:
        if empty:
            grad_w = torch.zeros(E, N, K, dtype=w.dtype, device=w.device).transpose(1, 2)
        else:
            grad_w = torch._grouped_mm(grad.t(), x, offs=offs).transpose(1, 2)
    return grad_x, grad_w, None


_grouped_mm.register_autograd(_backward, setup_context=_setup_context)

_OP = torch.ops.gluon_survey.grouped_mm.default


class _EagerGroupedMM(torch.autograd.Function):
    """The operator's forward and gradients for eager autograd, without its dispatch (`grouped_mm`
    in eager training): the same checks and products. Autograd runs the backward on a thread of
    its own, so it makes the gradient's device current first, as the operator does."""

    @staticmethod
    def forward(ctx, x, w, offs):
        _setup_context(ctx, (x, w, offs), None)
        return grouped.grouped_matmul(x, w, offs)

    @staticmethod
    def backward(ctx, grad):
        if grad.is_cuda:
            torch.cuda.set_device(grad.device)
        return _backward(ctx, grad)


def grouped_mm(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """out[rows of expert e] = x[rows of e] @ w[e] through the `gluon_survey::grouped_mm` operator:
    `gluon_survey.grouped_matmul` (same arguments and errors, no `out`) that torch.compile and
    autograd can see through (the module docstring says how gradients are computed). A non-tensor
    gets grouped_matmul's TypeError here, before the operator's schema would refuse it with a
    RuntimeError. In eager mode (`api.untraced_cuda`) it runs the operator's forward and gradients
    without the operator's dispatch, which cost a mixture-of-experts model's decode step more host
    time than its kernels (docs/perf-notes.md, entry 63)."""
    for name, t in (("x", x), ("w", w), ("offs", offs)):
        api.require_tensor(name, t)
    if api.untraced_cuda(x, w):
        # eager: `grouped_matmul` itself, at its host cost rather than torch.library's dispatch
        # (`_EagerGroupedMM` where autograd records the call)
        if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad):
            return _EagerGroupedMM.apply(x, w, offs)
        return grouped.grouped_matmul(x, w, offs)
    return _OP(x, w, offs)


@torch.library.custom_op("gluon_survey::grouped_swiglu", mutates_args=())
def _grouped_swiglu(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    if x.is_cuda:
        torch.cuda.set_device(x.device)  # as `_grouped_mm`
    return grouped.grouped_swiglu(x, w, offs)


@_grouped_swiglu.register_fake
def _grouped_swiglu_fake(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    if isinstance(offs, torch.Tensor) and offs.device.type == "cpu":
        api.require_cuda("offs", offs)  # as `_grouped_mm_fake`
    S, I = grouped._check(x, w, offs, None, glu=True)
    return x.new_empty((S, I))


_SWIGLU_OP = torch.ops.gluon_survey.grouped_swiglu.default


def grouped_swiglu(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """silu(h[:, :I]) * h[:, I:] of h[rows of e] = x[rows of e] @ w[e] through the
    `gluon_survey::grouped_swiglu` operator: `gluon_survey.grouped_swiglu` (same arguments and
    errors, no `out`) as one node for torch.compile. Forward only: where autograd would record
    the call (grad mode on and x or w requiring grad) a RuntimeError says to run it under
    torch.no_grad() or use grouped_mm and the gate apart."""
    for name, t in (("x", x), ("w", w), ("offs", offs)):
        api.require_tensor(name, t)
    if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad):
        raise RuntimeError(
            "gluon_survey::grouped_swiglu has no gradients: run it under torch.no_grad() (inference), "
            "or use grouped_mm and the gate apart for training"
        )
    if api.untraced_cuda(x, w):
        return grouped.grouped_swiglu(x, w, offs)  # eager: without the operator's dispatch
    return _SWIGLU_OP(x, w, offs)


def _require_expert_ids(top_k_index: torch.Tensor) -> None:
    """TypeError unless the router's expert ids are integers (`route`'s and `routed_experts`' check)."""
    if top_k_index.dtype.is_floating_point or top_k_index.dtype.is_complex or top_k_index.dtype == torch.bool:
        raise TypeError(
            f"top_k_index is {top_k_index.dtype}; expert ids are integers (torch.int64 from topk)"
        )


def route(top_k_index: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A router's choices grouped by expert, for `grouped_mm`: (expert_ids, perm, offs).

    top_k_index [T, k] (any shape: it is flattened, token-major, into S = T * k (token, expert)
    pairs) holds expert ids; perm [S] sorts the pairs by expert (stable: within an expert, in
    token order), expert_ids [S] is the sorted ids (top_k_index.reshape(-1)[perm]) and offs int32
    [num_experts] the cumulative ends of each expert's pairs. Pair i of the sorted order is token
    perm[i] // k. Ids at or above num_experts (what expert parallelism uses for experts held
    elsewhere) sort last and belong to no expert: they lie at or past offs[-1].

    Everything stays on top_k_index's device with no host synchronisation (a sort and a
    searchsorted: each expert's end is the number of ids below the next expert's), so a
    CUDA-graph capture replays it for any routing."""
    api.require_tensor("top_k_index", top_k_index)
    _require_expert_ids(top_k_index)
    if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 1:
        raise ValueError(f"num_experts must be a whole number >= 1, got {num_experts!r}")
    expert_ids, perm = torch.sort(top_k_index.reshape(-1), stable=True)
    ends = torch.arange(1, num_experts + 1, device=expert_ids.device, dtype=expert_ids.dtype)
    offs = torch.searchsorted(expert_ids, ends, out_int32=True)
    return expert_ids, perm, offs


# ------------------------------------------------------------------------------------------------
# The routed decode path: both projections with the routing in the kernels (kernels/routed.py)

ROUTED_DTYPES = (torch.float16, torch.bfloat16)
_ROUTED_PLANS: dict[tuple, object] = {}
_MAX_ROUTED_PLANS = 256  # past this many keys the cache starts again from empty (as grouped's)


def routed_max_k(elem_bytes: int = 2) -> int:
    """The deepest H or I the routed kernels take (one chunk of a row a program)."""
    return routed.max_k(elem_bytes)


def _routed_key(*tensors: torch.Tensor) -> tuple:
    """Everything the routed plan reads of its arguments but their addresses: shapes, strides,
    dtypes, devices and whether each base is 16-byte aligned (what Triton specializes on)."""
    return tuple(map(api.tensor_key, tensors))


def routed_experts(
    x: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
) -> torch.Tensor:
    """A SwiGLU mixture-of-experts layer's experts in two launches, the routing read in the kernels
    (kernels/routed.py): out[t] = sum_j top_k_weights[t, j] * down_e(silu(gate_e(x[t])) *
    up_e(x[t])), e = top_k_index[t, j], with transformers' weights as they are stored: w_gate_up
    [E, 2I, H] (the gate rows first, then the up rows) and w_down [E, H, I], both contiguous.
    x [T, H] row-major fp16/bf16 (the weights' dtype); top_k_index [T, k] integer, top_k_weights
    [T, k] floating, both contiguous. Ids at or past E add zero. Returns [T, H] in x's dtype.
    Inference only (no gradients), for decode: it reads each pair's expert rows once per pair
    (`gluon_survey.experts` says where it runs). ValueError or TypeError naming the problem and
    the fix for anything else."""
    key = _routed_key(x, w_gate_up, w_down, top_k_index, top_k_weights)
    plan = _ROUTED_PLANS.get(key)
    if plan is None:
        _check_routed(x, w_gate_up, w_down, top_k_index, top_k_weights)
        if x.shape[0] == 0:
            return x.new_empty(x.shape)
        plan = routed.plan(x, w_gate_up, w_down, top_k_index)
        if len(_ROUTED_PLANS) >= _MAX_ROUTED_PLANS:
            _ROUTED_PLANS.clear()
        _ROUTED_PLANS[key] = plan
    return plan.launch(x, w_gate_up, w_down, top_k_index, top_k_weights)


def _check_routed(x, w_gate_up, w_down, top_k_index, top_k_weights) -> None:
    """routed_experts' argument checks, before the GPU: each error names the argument and the fix."""
    named = (("x", x), ("w_gate_up", w_gate_up), ("w_down", w_down))
    named += (("top_k_index", top_k_index), ("top_k_weights", top_k_weights))
    for name, t in named:
        api.require_tensor(name, t)
        api.require_cuda(name, t)
    for name, t in named[1:]:
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}: put them on one GPU")
    if x.dim() != 2 or w_gate_up.dim() != 3 or w_down.dim() != 3:
        raise ValueError(
            f"shapes x {tuple(x.shape)}, w_gate_up {tuple(w_gate_up.shape)}, w_down {tuple(w_down.shape)}: "
            "routed_experts takes x [T, H], w_gate_up [E, 2I, H] and w_down [E, H, I]"
        )
    (T, H), (E, two_i, h_in), I = x.shape, w_gate_up.shape, w_down.shape[2]
    if two_i % 2 or h_in != H or tuple(w_down.shape) != (E, H, two_i // 2):
        raise ValueError(
            f"w_gate_up {tuple(w_gate_up.shape)} and w_down {tuple(w_down.shape)} do not fit x "
            f"{tuple(x.shape)}: routed_experts takes w_gate_up [E, 2I, H = {H}] and w_down [E, H, I]"
        )
    if x.dtype not in ROUTED_DTYPES or w_gate_up.dtype != x.dtype or w_down.dtype != x.dtype:
        raise TypeError(
            f"x {x.dtype}, w_gate_up {w_gate_up.dtype}, w_down {w_down.dtype}: routed_experts takes "
            "fp16 or bf16, one dtype for all three (cast x to the weights' dtype)"
        )
    if (
        top_k_index.dim() != 2
        or top_k_index.shape[0] != T
        or tuple(top_k_weights.shape) != tuple(top_k_index.shape)
    ):
        raise ValueError(
            f"top_k_index {tuple(top_k_index.shape)} and top_k_weights {tuple(top_k_weights.shape)}: both "
            f"must be [T, k] with T = {T}, x's rows"
        )
    _require_expert_ids(top_k_index)
    if not top_k_weights.dtype.is_floating_point:
        raise TypeError(f"top_k_weights is {top_k_weights.dtype}; routing weights are floating point")
    for name, t in named:
        if not t.is_contiguous():
            raise ValueError(f"{name} (strides {t.stride()}) must be contiguous: pass {name}.contiguous()")
    deepest = routed.max_k(x.element_size())
    if max(H, I) > deepest:
        raise ValueError(
            f"H = {H} and I = {I}: the routed kernels take each row in one chunk of at most {deepest} "
            "elements; use the sorted path (gluon_survey.experts runs it there)"
        )
    capability = api.target_of(x.device).capability
    if reason := routed.unsupported_reason(capability):
        raise RuntimeError(f"routed_experts cannot run on this GPU: {reason}")
