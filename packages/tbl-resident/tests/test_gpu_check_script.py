"""The device-check script runs end to end on the CPU device (tiny sizes), so it cannot rot unnoticed."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"


def test_gpu_check_quick_on_cpu(tmp_path):
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "check.json"
    rc = module.main(["--device", "cpu", "--quick", "--skip-tests", "--dataset-gb", "0.0005", "--epochs", "1",
                      "--warmup", "0", "--tmp", str(tmp_path), "--out", str(out)])
    assert rc == 0
    result = json.loads(out.read_text())
    assert result["images"] == 162 and result["upload"]["bytes"] == 162 * 32 * 32 * 3
    for label in ("float16", "float32", "float16+flip+crop"):
        serving = result["serving"][label]
        assert serving["images_per_s"] > 0 and serving["d2d_copy_same_bytes"]["images_per_s"] > 0
    assert result["goals"] == {}  # goals are judged on CUDA at full size only
    assert not any(p.name.startswith("tbl-resident-check-") for p in tmp_path.iterdir())  # data removed
