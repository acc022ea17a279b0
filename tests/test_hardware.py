import time

import pytest
import torch

from gluon_survey.driver import hardware


@pytest.mark.parametrize(
    ("name", "dtype", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", "fp16", 989.4),  # the SXM part, as torch names it
        ("NVIDIA H100 PCIe", "bf16", 756.0),
        ("NVIDIA H200", "bf16", 989.4),
        ("NVIDIA B200", "fp16", 2250.0),
        ("NVIDIA GB200", "fp16", 2500.0),  # not the B200 entry, although "B200" is in the name
        ("NVIDIA A100-SXM4-80GB", "fp16", 312.0),
        # fp8 e4m3: the datasheets' sparse figures halved
        ("NVIDIA H100 80GB HBM3", "fp8", 1979.0),
        ("NVIDIA H100 PCIe", "fp8", 1513.0),
        ("NVIDIA H200", "fp8-row", 1979.0),
        ("NVIDIA B200", "fp8", 4500.0),
        ("NVIDIA GB200", "fp8-row", 5000.0),
    ],
)
def test_dense_datasheet_peaks(name, dtype, peak):
    value, source = hardware.peak_tflops(name, dtype)
    assert value == peak
    assert "datasheet" in source and "dense" in source and dtype in source


def test_fp8_and_fp8_row_share_the_fp8_tensor_core_peak():
    per_tensor, source = hardware.peak_tflops("NVIDIA H100 80GB HBM3", "fp8")
    rowwise, row_source = hardware.peak_tflops("NVIDIA H100 80GB HBM3", "fp8-row")
    assert per_tensor == rowwise == 1979.0
    assert source.endswith("(fp8)") and row_source.endswith("(fp8, for fp8-row)")


def test_unknown_gpu_or_dtype_says_so():
    assert hardware.peak_tflops("NVIDIA GeForce RTX 4090", "fp16") == (
        None,
        "unknown GPU 'NVIDIA GeForce RTX 4090': no datasheet peak; pass --peak-tflops",
    )
    value, source = hardware.peak_tflops("NVIDIA A100-SXM4-80GB", "fp8")  # no fp8 tensor cores
    assert value is None and source == "no fp8 peak for A100 in the table; pass --peak-tflops"
    value, source = hardware.peak_tflops("NVIDIA H100 80GB HBM3", "fp32")
    assert value is None and "no fp32 peak" in source
    assert hardware.peak_tflops(None, "fp16") == (None, "no GPU, no peak")


def test_gpu_info_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    info = hardware.gpu_info(command="gluon-survey list")
    assert info["command"] == "gluon-survey list"
    assert info["torch"] == torch.__version__ and info["cuda_available"] is False
    assert info["date"] and info["triton"] and "name" not in info
    git = info["git"]
    assert git is None or (len(git["commit"]) == 40 and isinstance(git["dirty"], bool))
    assert hardware.describe_torch_cuda().endswith("CUDA not available")


def test_telemetry_averages_nvml_samples(monkeypatch):
    import sys
    import types

    clocks = iter([1500, 1300] + [1400] * 1000)
    fake = types.SimpleNamespace(
        NVML_CLOCK_SM=0,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetHandleByUUID=lambda uuid: ("handle", uuid),
        nvmlDeviceGetHandleByIndex=lambda index: ("handle", index),
        nvmlDeviceGetClockInfo=lambda handle, kind: next(clocks),
        nvmlDeviceGetPowerUsage=lambda handle: 650_000,  # milliwatts
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with hardware.Telemetry("GPU-x", period_s=0.001) as t:
        deadline = time.monotonic() + 5
        while len(t.samples) < 3 and time.monotonic() < deadline:
            time.sleep(0.001)
    result = t.result()
    assert 1300 <= result["sm_clock_mhz"] <= 1500 and result["power_w"] == 650.0


def test_telemetry_over_spans_takes_the_samples_inside_them():
    t = hardware.Telemetry()
    t.samples = [(1.0, 1400.0, 690.0), (2.0, 1500.0, 680.0), (3.0, 1980.0, 200.0), (4.0, 1600.0, 670.0)]
    assert t.result([(0.5, 2.0), (3.5, 9.0)]) == {"sm_clock_mhz": 1500.0, "power_w": 680.0}
    assert t.result([(2.5, 3.5)]) == {"sm_clock_mhz": 1980.0, "power_w": 200.0}
    assert t.result([(5.0, 6.0)]) == {} and t.result()["sm_clock_mhz"] == 1620.0


def test_telemetry_without_nvml_is_empty_not_an_error(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    with hardware.Telemetry() as t:
        pass
    assert t.result() == {}
