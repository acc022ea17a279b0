"""Device memory that outlives a call: allocated outside every CUDA graph's memory pool.

A few tensors live as long as the process, not as long as a call: the 1x1 tensor per dtype and
device whose expansion `matmul`'s plans allocate outputs from (`empty_like`), and split-K's
workspace (kernels/splitk.py). The first call that needs one may run where PyTorch sends every
allocation to a CUDA graph's private pool: inside `torch.cuda.graph` capture, and in the warm-up
run of torch.compile's CUDA-graph trees (`mode="reduce-overhead"`), which sends a thread's
allocations to the graph's pool without capturing anything. A tensor allocated there and kept
belongs to that pool's bookkeeping: CUDA-graph trees refuse it ("tensor(s) in the cudagraph pool
not tracked as outputs"), and a later graph may reuse its memory. So such tensors are allocated
under `persistent(device)`: in a `torch.cuda.MemPool` of this package's own per device. Inside a
stream capture (`torch.cuda.graph`) an inner `torch.cuda.use_mem_pool` wins (seen on an H200 with
torch 2.11, including a new segment allocated mid-capture); in CUDA-graph trees' warm-up it does
not (measured there: the 1x1 tensor landed in the graph's pool, and the trees refused it). So what
a plan keeps is made before any graph where the package first meets a model, eagerly:
`reserve(dtype, device)`, which `Linear.from_linear` (and so `patch`) calls. A bare `matmul`
whose very first call of an output dtype happens in the trees' warm-up still meets the trees'
error; one eager call first avoids it. Nothing allocated here is ever freed while a graph may
hold its address.

What such a pool cannot give inside a stream capture is memory that is *initialized*: a fill on
the capturing stream is recorded into the graph, not run, and waiting for one on another stream
is not allowed. `capturing()` says when that is the case, so that a caller that needs zeros can
refuse with the fix (one call before the capture) instead of handing the kernel garbage.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

_POOLS: dict[torch.device, object] = {}  # device -> torch.cuda.MemPool


@contextlib.contextmanager
def persistent(device: torch.device) -> Iterator[None]:
    """Allocations on `device` inside go to this package's own memory pool, never a CUDA graph's
    (module docstring). For tensors kept past the call; the pool is kept as long as the process."""
    if not _real_cuda():  # FakeTensors, or no GPU: nothing is allocated on one
        yield
        return
    pool = _POOLS.get(device)
    if pool is None:
        pool = _POOLS[device] = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool, device=device):
        yield


def _real_cuda() -> bool:
    return torch.cuda.is_available() and not is_in_torch_dispatch_mode()


def capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (no work launched now runs now)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


_LIKE: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}


def one_element(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A 1x1 tensor of `dtype` on `device`, one per pair for the process, outside every graph pool:
    `one_element(...).expand(M, N)` is what `torch.empty_like` makes an (M, N) output of. Its
    value is never read."""
    key = (dtype, device)
    t = _LIKE.get(key)
    if t is None:
        with persistent(device):
            t = torch.empty((1, 1), dtype=dtype, device=device)
        if type(t) is torch.Tensor:  # never keep a FakeTensor (tests, tracing) for real calls
            _LIKE[key] = t
    return t


def reserve(dtype: torch.dtype, device: torch.device) -> None:
    """Make now, eagerly and outside every graph, the tensors a first `matmul` on `device` with
    `dtype` outputs keeps (module docstring): the 1x1 output template, and the fp32 and int32 ones
    that split-K launches without a split take as their workspace."""
    if device.type != "cuda" or not _real_cuda():
        return
    for dt in (dtype, torch.float32, torch.int32):
        one_element(dt, device)
