"""Models as deployed TorchScript models are made (tests/real_models.py): transformers encoders, decoders and
encoder-decoders, a vision transformer, a ConvNeXt, grouped/dilated conv nets, an MLP-Mixer, a DenseNet block and a
detection head. Each converts on both backends with no kernel taken out by verification, and its package (and the
same package saved and loaded back) matches TorchScript on fresh inputs."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from helpers import BACKENDS, assert_matches_torchscript, convert_for
from real_models import REAL_MODELS, TRANSFORMERS_MODELS

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


def models():
    for name in REAL_MODELS:
        marks = [pytest.mark.skipif(not HAS_TRANSFORMERS, reason="needs transformers (pip install -e '.[test]')")] \
            if name in TRANSFORMERS_MODELS else []
        yield pytest.param(name, id=name, marks=marks)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", models())
def test_real_model_matches_torchscript(name: str, backend: str) -> None:
    torch.manual_seed(0)
    model, draw = REAL_MODELS[name]()
    converted = convert_for(model, draw(), backend)
    verification = converted.summary()["verification"]
    assert verification["status"] == "passed" and verification["kernels_removed"] == [], converted.report()
    assert converted.summary()["kernels"], "nothing was fused"
    assert_matches_torchscript(converted, model, draw)
