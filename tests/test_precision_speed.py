"""A reduced-precision package slower than its float32 model on this CPU gets a warning with the measured times
(jit2triton/precision.py's _warn_if_slower, run after the accuracy is measured); a faster one gets none."""
import re
import time
import types
import warnings

import pytest
import torch

from jit2triton.precision import SlowerPrecisionWarning, _warn_if_slower


def _verifier(function, device="cpu"):
    reference = types.SimpleNamespace(function=function)  # as IsolatedReference holds TorchScript's function
    return types.SimpleNamespace(reference=reference, cases=[("the example inputs", [torch.ones(2, device=device)],
                                                              None)])


def _takes(seconds):
    def call(*inputs):
        time.sleep(seconds)
        return inputs[0]
    return call


def test_slower_reduced_package_warns_with_both_times():
    with pytest.warns(SlowerPrecisionWarning, match=r"took (\d+\.\d+) ms a call and the float32 TorchScript model "
                                              r"(\d+\.\d+) ms \(medians of \d+, taking turns\)") as caught:
        _warn_if_slower(_takes(0.004), _verifier(_takes(0.0005)), budget_s=0.05)
    times = re.search(r"took (\d+\.\d+) ms a call and the float32 TorchScript model (\d+\.\d+) ms",
                      str(caught[0].message))
    reduced, full = float(times.group(1)), float(times.group(2))
    assert reduced > full >= 0.5


def test_faster_reduced_package_or_no_reference_is_quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("error", SlowerPrecisionWarning)
        _warn_if_slower(_takes(0.0005), _verifier(_takes(0.004)), budget_s=0.05)
        _warn_if_slower(_takes(0.004), types.SimpleNamespace(reference=lambda *x: x, cases=[]))  # nothing to time
