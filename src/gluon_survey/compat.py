"""Everything that differs between the Triton releases we support, in one place.

The kernels run on triton 3.6.0 (the GPU machine's) and must also compile with 3.9.0, the newest on
PyPI. 3.9 renamed the TMA copies, made aggregates immutable with an auto-generated ``__init__``,
renamed ``thread_barrier`` and replaced ``get_tmem_reg_layout``. Kernels import the names below and
never test the version themselves.
"""

from __future__ import annotations

import triton
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import tma

TRITON_VERSION = tuple(int(p) for p in triton.__version__.split(".")[:2])

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

__all__ = ["TRITON_VERSION", "GluonASTSource", "aggregate", "cta_barrier", "tma_load", "tma_store"]
