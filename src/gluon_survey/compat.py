"""Everything that differs between the Triton releases we support, in one place.

The kernels run on triton 3.6.0 (the GPU machine's) and must also compile with 3.9.0, the newest on
PyPI. 3.9 renamed the TMA copies, made aggregates public (immutable, with an auto-generated
``__init__``), moved ``GluonASTSource``, replaced ``get_tmem_reg_layout`` and restructured the
launcher under a compiled kernel (``raw_launch``: found on 3.6 only). Kernels import the names
below and never test the version themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import tma

# TMA copies: `async_copy_*` (3.6) became `async_load` / `async_store` (3.9 raises on the old names).
if hasattr(tma, "async_load"):
    tma_load = tma.async_load
    tma_store = tma.async_store
else:  # triton 3.6
    tma_load = tma.async_copy_global_to_shared
    tma_store = tma.async_copy_shared_to_global

# CTA-wide barrier: `gl.thread_barrier()` (3.6) became `gl.barrier()` (3.9).
cta_barrier = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier

# Aggregates (device-side structs). 3.6 keeps them private; 3.9 exports `gl.aggregate`. Both accept a
# hand-written `__init__`, and in 3.9 fields cannot be reassigned, so our aggregates build new instances.
try:
    from triton.experimental.gluon import aggregate  # 3.9
except ImportError:  # triton 3.6
    from triton.language.core import _aggregate as aggregate

try:
    from triton.experimental.gluon import GluonASTSource  # 3.9
except ImportError:  # triton 3.6
    from triton.experimental.gluon._runtime import GluonASTSource

try:
    from triton.backends.nvidia import driver as _nvidia_driver
except ImportError:  # no NVIDIA backend: nothing launches
    _nvidia_driver = None

__all__ = ["GluonASTSource", "aggregate", "cta_barrier", "tma_load", "tma_store"]


# --------------------------------------------------------------------------------------------------
# Blackwell: tensor memory and tcgen05 (sm_100a).
#
# `TensorMemoryLayout(block, col_stride)`, `allocate_tensor_memory`, `tcgen05_mma(..., mbarriers=)` and
# `tcgen05_commit(bar)` are called the same way in 3.6 and 3.9 (3.9 only adds keyword arguments).
# What differs is the register layout of a TMEM load: 3.6 needs an explicit layout from
# `get_tmem_reg_layout(dtype, shape, tmem_layout, num_warps)`; 3.9 removed that function, and
# `tmem.load()` infers the same 32x32b layout from the descriptor and the caller's warp count.
# `tmem_load(tmem)` hides that. Pass `TensorMemoryLayout.block` as a tuple: 3.6 hashes it as given.

from triton.experimental import gluon as _gluon  # noqa: E402
from triton.experimental.gluon.language.nvidia.blackwell import (  # noqa: E402
    TensorMemoryLayout,
    allocate_tensor_memory,
    tcgen05_commit,
    tcgen05_mma,
    tensor_memory_descriptor,
)

try:  # triton 3.6
    from triton.experimental.gluon.language.nvidia.blackwell import (
        get_tmem_reg_layout as _get_tmem_reg_layout,
    )
except ImportError:  # triton 3.9
    _get_tmem_reg_layout = None

if _get_tmem_reg_layout is not None:

    @_gluon.jit
    def tmem_load(tmem):
        """TMEM -> registers in the 32x32b layout (one TMEM lane, i.e. one row, per thread)."""
        layout: gl.constexpr = _get_tmem_reg_layout(tmem.dtype, tmem.shape, tmem.layout, gl.num_warps())
        return tmem.load(layout)

else:

    @_gluon.jit
    def tmem_load(tmem):
        """TMEM -> registers in the 32x32b layout (one TMEM lane, i.e. one row, per thread)."""
        return tmem.load()


__all__ += [
    "TensorMemoryLayout",
    "allocate_tensor_memory",
    "tcgen05_commit",
    "tcgen05_mma",
    "tensor_memory_descriptor",
    "tmem_load",
]


# --------------------------------------------------------------------------------------------------
# The launch under Triton's launcher (triton 3.6 only; elsewhere None, and the caller keeps Triton's).
#
# A compiled kernel's `run(grid, stream, function, metadata, hooks..., *args)` (3.6's `CudaLauncher`)
# allocates no scratch for our kernels and, for each tensor-descriptor argument, encodes a
# CUtensorMap from the descriptor (`make_tensordesc_arg`: the driver call `cuTensorMapEncodeTiled`)
# on every call, then calls the launcher compiled from C (`mod.launch`) with the descriptors
# expanded into (CUtensorMap, shape..., strides...). An encoded CUtensorMap depends only on the
# base address, shape, strides, dtype, block and swizzle, and the C launcher copies it into the
# kernel's parameters, so it may be encoded once and passed again. `raw_launch` finds that C
# launcher and the expansion; 3.9 restructured both (a generic `utils.launch` taking the kernel's
# signature), and is only compiled against here, never launched.


@dataclass(frozen=True)
class RawLaunch:
    """The C launcher behind a compiled kernel's `run`, and what it needs besides the arguments.

    `launch(gx, gy, gz, stream, *head, *args)` launches with `args` as Triton's launcher would
    pass them on: each tensor descriptor replaced by `encode(descriptor, i)` (the i-th descriptor
    of the signature), every other argument (constexprs included) as it is."""

    launch: object  # the C function
    head: tuple  # (function, cooperative, pdl, global scratch, profile scratch, metadata, 3 x None)
    descriptors: tuple[int, ...]  # the signature positions of the tensor-descriptor arguments
    meta: tuple  # Triton's per-descriptor metadata (swizzle, element type, block), in order

    def encode(self, descriptor, i: int) -> tuple:
        """(CUtensorMap, *shape, *strides) of a host TensorDescriptor, for descriptor number i."""
        return tuple(_nvidia_driver.make_tensordesc_arg(descriptor, self.meta[i]))


def raw_launch(compiled) -> RawLaunch | None:
    """`RawLaunch` of a kernel compiled and loaded by triton 3.6 (after its first launch), or None
    wherever the launcher is not the one described above: other releases, scratch memory to
    allocate, descriptors lowered without a CUtensorMap."""
    if _nvidia_driver is None or getattr(_nvidia_driver, "_BASE_ARGS_FORMAT", None) != "iiiKKppOOOOOO":
        return None
    run = compiled.run
    if type(run) is not getattr(_nvidia_driver, "CudaLauncher", None) or not hasattr(
        _nvidia_driver, "make_tensordesc_arg"
    ):
        return None
    if run.global_scratch_size or run.profile_scratch_size or getattr(run, "num_ctas", 1) != 1:
        return None
    signature = list(compiled.src.signature.values())
    descriptors = tuple(
        i for i, s in enumerate(signature) if isinstance(s, str) and s.startswith("tensordesc")
    )
    meta = tuple(getattr(compiled.metadata, "tensordesc_meta", None) or ())
    launch = run.launch
    if descriptors:  # `launch` is Triton's closure that encodes, around the C launcher
        if len(meta) != len(descriptors) or not all(isinstance(m, dict) for m in meta):
            return None
        cells = dict(zip(launch.__code__.co_freevars, launch.__closure__ or (), strict=True))
        if "launcher" not in cells:
            return None
        launch = cells["launcher"].cell_contents
    head = (
        compiled.function,
        run.launch_cooperative_grid,
        run.launch_pdl,
        None,
        None,
        compiled.packed_metadata,
        None,
        None,
        None,
    )
    return RawLaunch(launch, head, descriptors, meta)


__all__ += ["RawLaunch", "raw_launch"]
