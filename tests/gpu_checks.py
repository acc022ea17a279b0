"""Checks the dense GPU tests share."""

from __future__ import annotations

import torch

from gluon_survey.driver.check import reference, rel_error, tolerance


def assert_close_to_reference(out, a, b):
    """`out` has no NaN (every tile written) and is within the driver's tolerance of the fp32
    product a @ b, cuBLAS's error on the same inputs the yardstick."""
    ref = reference(a, b)
    cublas_err = rel_error(torch.matmul(a, b), ref)
    err = rel_error(out, ref)
    assert not torch.isnan(out).any(), "output has NaN: some tile was never written"
    assert err <= tolerance(cublas_err, a.dtype), f"rel error {err:.3e} vs cuBLAS {cublas_err:.3e}"
