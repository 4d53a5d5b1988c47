"""OutputSpec: backend resolution and the placement rules."""

from __future__ import annotations

import pytest

from tbl_loader.host.output import OutputSpec, allocate_host


def test_numpy_spec():
    spec = OutputSpec.create("numpy")
    assert (spec.backend, spec.device, spec.pin_memory, spec.cuda) == ("numpy", None, False, False)


def test_default_backend_follows_torch_availability():
    try:
        import torch  # noqa: F401

        expected = "torch"
    except ImportError:
        expected = "numpy"
    assert OutputSpec.create().backend == expected


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"backend": "cupy"}, ValueError, "backend"),
        ({"backend": "numpy", "device": "cuda"}, ValueError, "backend"),
        ({"backend": "numpy", "pin_memory": True}, ValueError, "pinned"),
    ],
)
def test_invalid_combinations(kwargs, error, match):
    with pytest.raises(error, match=match):
        OutputSpec.create(**kwargs)


def test_torch_cpu_device_means_host():
    pytest.importorskip("torch")
    assert OutputSpec.create("torch", "cpu").device is None


def test_allocate_rejects_unknown_dtype():
    with pytest.raises(ValueError, match="dtype"):
        allocate_host((2,), "float64", OutputSpec.create("numpy"))
