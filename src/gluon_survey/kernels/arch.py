"""The one place where Hopper and Blackwell part ways for the rungs that run on both (Blocked,
Pipelined, persistent): which MMA implementation a GPU gets. The host picks it once, from the
compute capability, and passes it to the kernel as a constexpr. (warpspec is two designs, one per
architecture, chosen by the registry: `kernels/warpspec.py` and `kernels/warpspec_tcgen05.py`.)"""

from __future__ import annotations

from .blackwell import MMAv5
from .hopper import WGMMA

MMAS = {9: WGMMA, 10: MMAv5}


def unsupported_reason(capability: tuple[int, int]) -> str | None:
    """wgmma needs sm_90a, tcgen05 needs sm_100a (not sm_120, which has neither)."""
    if capability[0] in MMAS:
        return None
    if capability[0] == 12:
        return "sm_120 (consumer Blackwell) has no tcgen05/tensor memory and no wgmma"
    return f"needs sm_90 (wgmma) or sm_100 (tcgen05); this GPU is sm_{capability[0]}{capability[1]}"


def select_mma(capability: tuple[int, int]):
    """The MMA aggregate class for a GPU: `WGMMA` on sm_90, `MMAv5` on sm_100."""
    reason = unsupported_reason(capability)
    if reason:
        raise RuntimeError(f"the Gluon rungs cannot run here: {reason}")
    return MMAS[capability[0]]
