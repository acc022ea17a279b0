"""gluon-survey: a ladder of Gluon GEMM kernels (Blocked -> Pipelined -> persistent -> warpspec)
measured against cuBLAS, torch.compile and Triton. `matmul(a, b, kernel=...)` runs any mode of the
survey; `explain(a, b)` says which kernel and config it would run and why."""

from .api import explain, matmul
from .registry import MODES

__version__ = "0.1.0"
__all__ = ["MODES", "__version__", "explain", "matmul"]
