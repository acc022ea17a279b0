"""Everything that differs between the Triton releases we support, in one place.

The kernels run on triton 3.6.0 (the GPU machine's) and must also compile with 3.9.0, the newest on
PyPI. 3.9 renamed the TMA copies, made aggregates public (immutable, with an auto-generated
``__init__``), moved ``GluonASTSource`` and replaced ``get_tmem_reg_layout``. Kernels import the
names below and never test the version themselves.
"""

from __future__ import annotations

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
