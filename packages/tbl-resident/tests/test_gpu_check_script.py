"""The device-check script runs end to end on the CPU device (tiny sizes), so it cannot rot unnoticed."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_check_quick_on_cpu(tmp_path):
    out = tmp_path / "check.json"
    rc = _module().main(["--device", "cpu", "--quick", "--skip-tests", "--phases", "resident,upload",
                         "--dataset-gb", "0.0005", "--upload-gb", "0.0005", "--epochs", "1", "--warmup", "0",
                         "--tmp", str(tmp_path), "--out", str(out)])
    assert rc == 0
    result = json.loads(out.read_text())
    assert result["datasets"]["resident_32"]["images"] == 162
    assert result["upload"]["bytes"] == 162 * 32 * 32 * 3 and result["upload"]["ratio_to_h2d"] > 0
    for label in ("32px/float16/plain", "32px/float32/plain", "32px/float16/flip+crop"):
        serving = result["serving"][label]
        assert serving["images_per_s"] > 0 and serving["d2d_copy_same_bytes"]["images_per_s"] > 0
    assert result["goals"] == {}  # goals are judged on CUDA at full size only
    assert not any(p.name.startswith("tbl-resident-check-") for p in tmp_path.iterdir())  # data removed


def test_gpu_check_host_and_jpeg_phases_on_cpu(tmp_path):
    pytest.importorskip("simplejpeg")
    out = tmp_path / "check.json"
    rc = _module().main(["--device", "cpu", "--quick", "--phases", "host,jpeg,train", "--epochs", "1", "--workers", "1",
                         "--warmup", "0", "--tmp", str(tmp_path), "--out", str(out)])
    assert rc == 0
    result = json.loads(out.read_text())
    assert result["host"]["tbl_uint8_device_transform"]["images_per_s"] > 0
    assert result["jpeg"]["cpu_decode"]["images_per_s"] > 0
    assert "skipped" in result["jpeg"]["nvjpeg"]  # CUDA only
    if result["torchvision"] is None:
        assert "skipped" in result["host"]["dataloader_torchvision"] and "skipped" in result["train"]
    else:
        assert result["host"]["dataloader_torchvision"]["images_per_s"] > 0
        assert result["train"]["synthetic"]["images_per_s"] > 0
