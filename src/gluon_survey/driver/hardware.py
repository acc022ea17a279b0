"""What a measurement ran on: the GPU, its clocks and power, the software stack, the checkout.

`gpu_info()` is recorded at the top of every results file so a number can always be traced back
to the machine, driver and commit that produced it. `peak_tflops()` is the dense datasheet peak
the tables divide by (and the sanity limit above which a measurement is flagged as an error).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import platform
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

# What torch sees, in the words of every "no CUDA GPU" message (the library's too): defined once, in api.
from gluon_survey.api import describe_torch_cuda as describe_torch_cuda

# Dense (no 2:4 sparsity) tensor-core peaks in TFLOP/s, from NVIDIA's datasheets, per tensor-core
# input type: "fp16", "bf16", "fp8" (e4m3/e5m2; the `--dtype`s fp8 and fp8-row both read the fp8
# column, `check.DtypeSpec.peak`). Matched as a case-insensitive substring of the device name,
# first match wins, so the more specific names come first ("H100 PCIe" before "H100", "GB200"
# before "B200"). A plain "H100" is the SXM part (torch reports it as "NVIDIA H100 80GB HBM3").
# The datasheets print the fp8 rates with sparsity; the dense figure is half of it (H100 SXM /
# H200 3,958 -> 1,979; H100 PCIe 3,026 -> 1,513; HGX B200 72 PFLOPS per 8 GPUs -> 4,500 per GPU;
# GB200 NVL72 720 PFLOPS per 72 GPUs -> 5,000 per GPU). The A100 has no fp8 tensor cores.
_PEAKS: tuple[tuple[str, dict[str, float], str], ...] = (
    ("H100 PCIe", {"fp16": 756.0, "bf16": 756.0, "fp8": 1513.0}, "NVIDIA H100 PCIe datasheet, dense"),
    ("H100", {"fp16": 989.4, "bf16": 989.4, "fp8": 1979.0}, "NVIDIA H100 SXM datasheet, dense"),
    ("H200", {"fp16": 989.4, "bf16": 989.4, "fp8": 1979.0}, "NVIDIA H200 SXM datasheet, dense"),
    ("GB200", {"fp16": 2500.0, "bf16": 2500.0, "fp8": 5000.0}, "NVIDIA GB200 datasheet, per GPU, dense"),
    ("B200", {"fp16": 2250.0, "bf16": 2250.0, "fp8": 4500.0}, "NVIDIA HGX B200 datasheet, per GPU, dense"),
    ("A100", {"fp16": 312.0, "bf16": 312.0}, "NVIDIA A100 datasheet, dense"),
)


def peak_tflops(name: str | None, dtype: str) -> tuple[float | None, str]:
    """The dense datasheet peak of GPU `name` for `dtype` (a `--dtype` name: "fp16", "bf16", "fp8",
    "fp8-row"), and where it comes from.

    (None, why) when the GPU or the dtype is not in the table; `--peak-tflops` overrides it.
    """
    if not name:
        return None, "no GPU, no peak"
    column = _peak_column(dtype)
    label = dtype if column == dtype else f"{column}, for {dtype}"
    for key, peaks, source in _PEAKS:
        if key.lower() in name.lower():
            if column in peaks:
                return peaks[column], f"{source} ({label})"
            return None, f"no {dtype} peak for {key} in the table; pass --peak-tflops"
    return None, f"unknown GPU {name!r}: no datasheet peak; pass --peak-tflops"


def _peak_column(dtype: str) -> str:
    """The peak table's column for a `--dtype` name (`check.DTYPE_SPECS`); other names as given."""
    from gluon_survey.driver.check import DTYPE_SPECS

    spec = DTYPE_SPECS.get(dtype)
    return spec.peak if spec is not None else dtype


# HBM bandwidth in GB/s (1 GB = 1e9 bytes) from NVIDIA's datasheets, matched like _PEAKS (the more
# specific names first). `gluon-survey memcpy` divides a copy's bytes read + written per second by
# it. torch names the A100s "NVIDIA A100-SXM4-80GB" and "NVIDIA A100 80GB PCIe"; the 40 GB parts
# (1,555 GB/s) are left out rather than matched to the 80 GB figure.
_BANDWIDTHS: tuple[tuple[str, float, str], ...] = (
    ("H100 PCIe", 2000.0, "NVIDIA H100 PCIe datasheet, 2 TB/s"),
    ("H100 NVL", 3900.0, "NVIDIA H100 NVL datasheet, 3.9 TB/s"),
    ("H100", 3350.0, "NVIDIA H100 SXM datasheet, 3.35 TB/s"),
    ("H200", 4800.0, "NVIDIA H200 SXM datasheet, 4.8 TB/s"),
    ("GB200", 8000.0, "NVIDIA GB200 datasheet, 8 TB/s per GPU"),
    ("B200", 8000.0, "NVIDIA HGX B200 datasheet, 8 TB/s per GPU"),
    ("A100 80GB PCIe", 1935.0, "NVIDIA A100 datasheet, 80GB PCIe, 1,935 GB/s"),
    ("A100-SXM4-80GB", 2039.0, "NVIDIA A100 datasheet, 80GB SXM, 2,039 GB/s"),
)


def memory_bandwidth_gbps(name: str | None) -> tuple[float | None, str]:
    """The datasheet memory bandwidth of GPU `name` in GB/s, and where it comes from; (None, why)
    when there is no GPU or it is not in the table."""
    if not name:
        return None, "no GPU, no datasheet bandwidth"
    for key, gbps, source in _BANDWIDTHS:
        if key.lower() in name.lower():
            return gbps, source
    return None, f"unknown GPU {name!r}: no datasheet bandwidth"


def gpu_info(command: str | None = None) -> dict[str, object]:
    """The environment of this process as a flat-ish JSON-able dict.

    GPU facts come from torch (name, capability, SMs, L2, memory) and, when readable, clocks,
    power and temperature from NVML (pynvml) or `nvidia-smi`. Never raises: whatever cannot be
    read is left out or None.
    """
    import torch
    import triton

    info: dict[str, object] = {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": command if command is not None else shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "git": git_commit(),
        "cuda_available": torch.cuda.is_available(),
    }
    if not torch.cuda.is_available():
        return info
    index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    info.update(
        name=props.name,
        capability=[props.major, props.minor],
        sm_count=props.multi_processor_count,
        l2_bytes=props.L2_cache_size,
        memory_bytes=props.total_memory,
    )
    info.update(_nvml_state(index, _nvml_uuid(props)))
    return info


def _nvml_uuid(props: object) -> str | None:
    """The device's UUID as NVML and nvidia-smi spell it ("GPU-..."): indices differ under
    CUDA_VISIBLE_DEVICES, UUIDs do not."""
    uuid = str(getattr(props, "uuid", "") or "")
    if not uuid:
        return None
    return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"


def git_commit() -> dict[str, object] | None:
    """{'commit': sha, 'dirty': bool} of the checkout this package runs from, or None.
    A copy of the tree without .git (e.g. shipped to a GPU box) can name its commit in
    GLUON_SURVEY_COMMIT."""
    if os.environ.get("GLUON_SURVEY_COMMIT"):
        return {"commit": os.environ["GLUON_SURVEY_COMMIT"], "dirty": None}
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": sha, "dirty": bool(status.strip())}


# What NVML / nvidia-smi report, under the keys the results file uses.
_SMI_FIELDS = {
    "driver_version": "driver",
    "clocks.sm": "sm_clock_mhz",
    "clocks.max.sm": "sm_clock_max_mhz",
    "clocks.mem": "mem_clock_mhz",
    "power.draw": "power_w",
    "power.limit": "power_limit_w",
    "temperature.gpu": "temperature_c",
    "pstate": "pstate",
}


def _nvml_state(index: int, uuid: str | None) -> dict[str, object]:
    try:
        return _pynvml_state(index, uuid)
    except ImportError:
        return _smi_state(index, uuid)
    except Exception as exc:  # NVML present but unusable (permissions, driver mismatch)
        return {"nvml_error": f"{type(exc).__name__}: {exc}"}


def _pynvml_state(index: int, uuid: str | None) -> dict[str, object]:
    import pynvml

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid) if uuid else pynvml.nvmlDeviceGetHandleByIndex(index)
        driver = pynvml.nvmlSystemGetDriverVersion()
        return {
            "driver": driver.decode() if isinstance(driver, bytes) else driver,
            "sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
            "sm_clock_max_mhz": pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
            "mem_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM),
            "power_w": pynvml.nvmlDeviceGetPowerUsage(handle) / 1000,
            "power_limit_w": pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000,
            "temperature_c": pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
            "pstate": f"P{pynvml.nvmlDeviceGetPerformanceState(handle)}",
        }
    finally:
        pynvml.nvmlShutdown()


def _smi_state(index: int, uuid: str | None) -> dict[str, object]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {}
    cmd = [
        smi,
        f"--query-gpu={','.join(_SMI_FIELDS)}",
        "--format=csv,noheader,nounits",
        "-i",
        uuid or str(index),
    ]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    values = [v.strip() for v in out.strip().splitlines()[0].split(",")] if out.strip() else []
    return {key: _number_or_text(v) for key, v in zip(_SMI_FIELDS.values(), values, strict=False)}


def _number_or_text(value: str) -> object:
    if value in ("[N/A]", "N/A", "[Not Supported]", ""):
        return None
    try:
        return float(value)
    except ValueError:
        return value


class Telemetry:
    """Mean SM clock and board power while a measurement runs, sampled from NVML in a thread.

    Under a power limit (an H100 SXM at 700 W reaches it on every large GEMM) the clock a kernel
    gets depends on its own power draw, so a row's clock explains part of its time. Use as a
    context manager around the timed region; `result()` is {} when NVML cannot be read (no
    pynvml, no GPU): telemetry is evidence, never a reason for a measurement to fail.
    """

    def __init__(self, uuid: str | None = None, index: int = 0, period_s: float = 0.02) -> None:
        self._uuid, self._index, self._period = uuid, index, period_s
        self.samples: list[tuple[float, float, float]] = []  # (host perf_counter(), MHz, W)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Telemetry:
        try:
            import pynvml

            pynvml.nvmlInit()
            get = pynvml.nvmlDeviceGetHandleByUUID if self._uuid else pynvml.nvmlDeviceGetHandleByIndex
            handle = get(self._uuid or self._index)
        except Exception:  # no pynvml, or NVML unusable here: no telemetry
            return self
        self._thread = threading.Thread(target=self._sample, args=(pynvml, handle), daemon=True)
        self._thread.start()
        return self

    def _sample(self, pynvml: object, handle: object) -> None:
        try:
            while not self._stop.is_set():
                clock = pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)  # type: ignore[attr-defined]
                power = pynvml.nvmlDeviceGetPowerUsage(handle) / 1000  # type: ignore[attr-defined]
                self.samples.append((time.perf_counter(), clock, power))
                self._stop.wait(self._period)
        except Exception:  # the device went away mid-run: keep what was sampled
            pass
        finally:
            with contextlib.suppress(Exception):
                pynvml.nvmlShutdown()  # type: ignore[attr-defined]

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def result(self, spans: Sequence[tuple[float, float]] | None = None) -> dict[str, float]:
        """{'sm_clock_mhz': mean, 'power_w': mean} over the samples, or {} without any; with
        `spans` ((start, end) in the host's perf_counter()), over the samples taken inside them
        (a paired timing's windows of one side: `timing.PairedTiming.spans`)."""
        picked = [(c, p) for t, c, p in self.samples if spans is None or any(a <= t <= b for a, b in spans)]
        if not picked:
            return {}
        return {
            "sm_clock_mhz": sum(c for c, _ in picked) / len(picked),
            "power_w": sum(p for _, p in picked) / len(picked),
        }


def telemetry_for_current_device() -> Telemetry:
    """A `Telemetry` for torch's current CUDA device (by UUID, so CUDA_VISIBLE_DEVICES is safe)."""
    import torch

    index = torch.cuda.current_device()
    return Telemetry(_nvml_uuid(torch.cuda.get_device_properties(index)), index)
