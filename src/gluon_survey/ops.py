"""`gluon_survey.matmul` as a PyTorch operator, and `Linear`, a drop-in `torch.nn.Linear` on it.

`torch.ops.gluon_survey.matmul(a, b, kernel, bias=None)` is a custom operator (`torch.library.custom_op`):
torch.compile (also with `fullgraph=True`), torch.export and CUDA-graph capture see one opaque node
whose output is described by a fake implementation, instead of tracing into Triton's launcher,
which they cannot. `kernel` is a mode name, "" for matmul's default. The fake implementation runs
matmul's argument checks, so CPU tensors, fp32, mismatched shapes or dtypes and unknown kernels
fail when a function is traced (TypeError / ValueError / KeyError), not when compiled code first
runs. In eager mode the operator costs torch.library's Python dispatch on top of `matmul`, several
times `matmul`'s own overhead (`gluon-survey overhead` measures both): eager code that wants the
cheapest call calls `gluon_survey.matmul`, as `Linear` does itself in eager mode (in eager
training through `_EagerMatmul`, an autograd.Function with the operator's backward); compiled
code and CUDA graphs do not pay it per call.

Gradients are registered with the operator itself: grad_a = grad @ b^T, grad_b = a^T @ grad, both
through the survey's kernels (a transposed A, such as grad^T, is read in place where the mode
that runs can, `gluon_survey.api`'s docstring; else it gets matmul's aligned copy),
and with a bias (added in the kernels' epilogue: `gluon_survey.matmul(bias=)`) grad_bias = grad
summed over its rows, in fp32, then cast to the bias's dtype.
For B the transpose view of a weight ("t", `w.t()`, as in `Linear`) grad_b is computed as
(grad^T @ a)^T, so the weight's gradient comes out row-major like the weight.

Importing this module registers the operator; `import gluon_survey` does not import it until
`gluon_survey.ops` or `gluon_survey.Linear` is first used.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from . import api, memory, registry
from .launch import b_layout


@torch.library.custom_op("gluon_survey::matmul", mutates_args=())
def _matmul(a: torch.Tensor, b: torch.Tensor, kernel: str, bias: torch.Tensor | None = None) -> torch.Tensor:
    if a.is_cuda:
        # The operator also runs on threads that have made no CUDA call yet: autograd runs the
        # backward on a thread of its own, where torch has not made a CUDA context current (it
        # skips setting a device it takes to be current already), and TMA descriptors are encoded
        # through the driver API, which needs one. set_device makes a.device's context current
        # (and a.device the current device, which Triton launches on).
        torch.cuda.set_device(a.device)
    return api.matmul(a, b, kernel=kernel or None, bias=bias)


@_matmul.register_fake
def _matmul_fake(
    a: torch.Tensor, b: torch.Tensor, kernel: str, bias: torch.Tensor | None = None
) -> torch.Tensor:
    # matmul's checks: an unknown kernel is a KeyError naming the valid modes, a wrong bias says why
    api._check_operands(a, b, None, mode=kernel or None, bias=bias)
    return a.new_empty((a.shape[0], b.shape[1]))


def _setup_context(ctx, inputs, output) -> None:
    a, b, kernel, bias = inputs
    ctx.save_for_backward(a, b)
    ctx.kernel = kernel
    ctx.bias_dtype = None if bias is None else bias.dtype


def _backward_products(ctx, grad: torch.Tensor) -> list[tuple[int, torch.Tensor, torch.Tensor, bool]]:
    """The backward's products of a @ b for the inputs that need a gradient, as (input index, left,
    right, whether the gradient is the product's transpose): grad_a = grad @ b^T, and grad_b =
    a^T @ grad, or for b = w.t() (the [N, K] weight's gradient, row-major) (grad^T @ a)^T."""
    a, b = ctx.saved_tensors
    products = []
    if ctx.needs_input_grad[0]:
        products.append((0, grad, b.t(), False))
    if ctx.needs_input_grad[1]:
        products.append((1, grad.t(), a, True) if b_layout(b) == "t" else (1, a.t(), grad, False))
    return products


def _gradients(ctx, grad: torch.Tensor, mm):
    """The backward of a @ b (+ bias) for the inputs that need one, its products
    (`_backward_products`) through `mm` (the operator, or in eager autograd `gluon_survey.matmul`
    itself: `_EagerMatmul`)."""
    grads = [None, None, None, None]
    for i, left, right, transposed in _backward_products(ctx, grad):
        product = mm(left, right, ctx.kernel)
        grads[i] = product.t() if transposed else product
    if ctx.bias_dtype is not None and ctx.needs_input_grad[3]:
        grads[3] = grad.sum(0, dtype=torch.float32).to(ctx.bias_dtype)
    return tuple(grads)


def _backward(ctx, grad: torch.Tensor):
    return _gradients(ctx, grad, _OP)


_matmul.register_autograd(_backward, setup_context=_setup_context)

_OP = torch.ops.gluon_survey.matmul.default


def matmul(
    a: torch.Tensor, b: torch.Tensor, kernel: str | None = None, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """a @ b (+ bias) through the `gluon_survey::matmul` operator: `gluon_survey.matmul` (same
    arguments and errors, no `out`, no fp8) that torch.compile(fullgraph=True) and autograd can
    see through. A non-tensor gets matmul's TypeError here, before the operator's schema would
    refuse it with a RuntimeError."""
    api.require_tensor("a", a)
    api.require_tensor("b", b)
    if bias is not None:
        api.require_tensor("bias", bias)
    return _OP(a, b, kernel or "", bias)


def _direct(a: torch.Tensor, b: torch.Tensor, kernel: str, bias: torch.Tensor | None = None) -> torch.Tensor:
    return api.matmul(a, b, kernel=kernel or None, bias=bias)


class _EagerMatmul(torch.autograd.Function):
    """The operator's product and backward for eager autograd, without its dispatch: `Linear` in
    eager training (`_eager`) runs the forward and both backward products as `gluon_survey.matmul`
    calls, the same kernels as the operator's, at `matmul`'s host cost instead of torch.library's
    (module docstring). Autograd runs the backward on a thread of its own, so it makes the
    gradient's device current first, as the operator does.

    `route`, where given, is `Linear`'s (routes, key) for this input layout: after the backward,
    routes[key] says whether matmul ran cuBLAS itself for the forward and for each backward product
    (`api.runs_cublas`), so that `Linear` runs such a layout's later steps as `F.linear`."""

    @staticmethod
    def forward(ctx, a, b, kernel: str, bias, route=None):
        _setup_context(ctx, (a, b, kernel, bias), None)
        y = _direct(a, b, kernel, bias)
        ctx.route = route if route is not None and api.runs_cublas(a, b, kernel or None, bias) else None
        if route is not None and ctx.route is None:
            route[0][route[1]] = False
        return y

    @staticmethod
    def backward(ctx, grad):
        if grad.is_cuda:
            torch.cuda.set_device(grad.device)
        grads = _gradients(ctx, grad, _direct)
        if ctx.route is not None:
            routes, key = ctx.route
            routes[key] = _backward_runs_cublas(ctx, grad)
        return (*grads, None)


def _backward_runs_cublas(ctx, grad: torch.Tensor) -> bool:
    """Whether matmul ran cuBLAS itself for each backward product `_gradients` just ran."""
    kernel = ctx.kernel or None
    products = _backward_products(ctx, grad)
    return all(api.runs_cublas(left, right, kernel, None) for _, left, right, _ in products)


def fuses_bias(kernel: str | None) -> bool:
    """Whether matmul with this kernel (None or "": the default, `auto`) adds a bias in its
    epilogue; those that add none (the triton and torch.compile baselines) get `Linear`'s bias
    as a separate add. An unknown kernel counts as adding it: matmul then raises its KeyError."""
    if not kernel:
        return True
    try:
        return registry.get(kernel).bias
    except KeyError:
        return True


def _eager(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `Linear.forward` may call `gluon_survey.matmul` itself instead of the operator
    (`api.untraced_cuda`: nothing traces the call, x a plain CUDA tensor on the current device, a
    plain weight). Where autograd records the product, it is `_EagerMatmul`'s."""
    return api.untraced_cuda(x, weight)


def _records(*tensors: torch.Tensor | None) -> bool:
    """Whether autograd records a product of these tensors."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


class Linear(nn.Linear):
    """`torch.nn.Linear` whose product runs on the survey's kernels: y = x @ weight^T + bias.

    weight is [out_features, in_features] and bias [out_features] (or None), as in nn.Linear, and
    both must have x's dtype, fp16 or bf16 (`dtype=torch.bfloat16`, or `.to(...)` the module),
    on a CUDA device. x [..., in_features]: the leading dimensions are flattened into M, the
    product is the operator `gluon_survey::matmul` on `weight.t()` (the "t" B layout: no copy of
    the weight), and the bias goes with it, added in the GEMM's epilogue (with a `kernel` that
    adds none, the triton and torch.compile baselines: a separate, in-place add on the product).
    `kernel` is a mode name; None runs matmul's default. In eager mode (nothing tracing) the
    product is `gluon_survey.matmul` itself, the same kernels without the operator's dispatch
    (`_eager`), and where autograd records it, `_EagerMatmul` with the operator's backward. In
    eager inference, an input layout for which matmul runs cuBLAS itself is from its second call
    on `F.linear`, nn.Linear's own call (`_stock_route`): cuBLAS either way, at nn.Linear's host
    cost. In eager training the same holds once a step's forward and backward found matmul running
    cuBLAS itself for all three products: the later steps of that layout are `F.linear`, whose
    backward is autograd's own (the same cuBLAS products, without a Python backward).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        device=None,
        dtype=None,
        kernel: str | None = None,
    ) -> None:
        super().__init__(in_features, out_features, bias, device, dtype)
        self.kernel = kernel
        # Eager calls: per input layout (and in training, which inputs need gradients), whether
        # matmul runs cuBLAS itself for every product (then the call is F.linear, nn.Linear's
        # own), for this weight and bias (`_stock_route`).
        self._routes: dict[tuple, bool] = {}
        self._routes_for: tuple = ()

    @classmethod
    def from_linear(cls, linear: nn.Linear, kernel: str | None = None) -> Linear:
        """A Linear on `linear`'s own weight and bias Parameters (shared, not copied: training or
        loading either changes both), to swap into a model in its place."""
        new = cls(
            linear.in_features,
            linear.out_features,
            bias=linear.bias is not None,
            device="meta",  # placeholders, replaced below: nothing is allocated or initialised
            dtype=linear.weight.dtype,
            kernel=kernel,
        )
        new.weight = linear.weight
        new.bias = linear.bias
        # what a first call keeps, made now, before any CUDA graph (torch.compile's CUDA-graph trees)
        memory.reserve(linear.weight.dtype, linear.weight.device)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = self.weight, self.bias
        eager = _eager(x, weight)
        records = _records(x, weight, bias)
        if eager:
            routes = self._stock_route(weight, bias)
            key = (x.shape, x.stride(), x.dtype, weight.dtype)
            if records:  # training: the backward's products count too, and which of them run
                key = (*key, x.requires_grad, weight.requires_grad, bias is not None and bias.requires_grad)
            stock = routes.get(key)
            if stock:  # matmul would run cuBLAS itself for every product: nn.Linear's own call
                return F.linear(x, weight, bias)
        flat = x.dim() != 2  # [..., in_features] -> [M, in_features], and back
        x2 = x.reshape(math.prod(x.shape[:-1]), self.in_features) if flat else x
        separate = bias is not None and not fuses_bias(self.kernel)
        fused = None if separate else bias
        if not eager:
            y = _OP(x2, weight.t(), self.kernel or "", fused)
        elif records:
            route = (routes, key) if stock is None and not separate else None
            y = _EagerMatmul.apply(x2, weight.t(), self.kernel or "", fused, route)
        else:
            y = api.matmul(x2, weight.t(), kernel=self.kernel or None, bias=fused)
            if key not in routes:
                routes[key] = not separate and api.runs_cublas(x2, weight.t(), self.kernel or None, fused)
        if separate:
            y.add_(bias)
        return y.view(*x.shape[:-1], self.out_features) if flat else y

    def _stock_route(self, weight: torch.Tensor, bias: torch.Tensor | None) -> dict[tuple, bool]:
        """The input layouts (shape, strides, dtype; in training also which inputs need gradients)
        for which an eager call is F.linear: those whose first call found that matmul runs cuBLAS
        itself (`api.runs_cublas`) for the forward and, in training, for the backward's products
        (`_EagerMatmul`), so that such a call costs what nn.Linear's does, not matmul's plan
        lookup and a reshape on top, nor a Python backward. Kept per weight, bias, kernel, A-layout
        switch and plan cache (a new one of any starts it afresh)."""
        kept = self._routes_for  # compared field by field, the common case without a tuple built
        if not (
            kept
            and kept[0] is weight
            and kept[1] is bias
            and kept[2] is self.kernel
            and kept[3] is api.TRANSPOSED_A_IN_PLACE
            and kept[4] is api.PLANS_CLEARED
        ):
            owner = (weight, bias, self.kernel, api.TRANSPOSED_A_IN_PLACE, api.PLANS_CLEARED)
            self._routes, self._routes_for = {}, owner
        return self._routes

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, kernel={self.kernel!r}"
