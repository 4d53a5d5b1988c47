"""Runs each configuration in its own subprocess and collects the results.

In-process comparisons contaminate each other (thread pools, allocator state,
imported libraries), so every `Config` gets a fresh interpreter
(`python -m tbl_bench.child`). A crash, a timeout or a non-zero exit becomes a
"failed" result with the tail of the child's stderr; the run goes on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from tbl_bench.harness import Config, failed_result, script_result, skipped_result

__all__ = ["parse_json_output", "run_config", "run_configs"]

_STDERR_TAIL = 2000


def run_config(config: Config, *, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run one configuration in a child interpreter and return its result dict."""
    if config.skip is not None:
        return skipped_result(config, config.skip)
    if config.kind == "script":
        return _run_script(config, env)
    with tempfile.TemporaryDirectory(prefix="tbl-bench-") as tmp:
        cfg_path = Path(tmp) / "config.json"
        res_path = Path(tmp) / "result.json"
        cfg_path.write_text(json.dumps(config.to_dict()))
        child_env = dict(os.environ if env is None else env)
        child_env.setdefault("PYTHONUNBUFFERED", "1")
        cmd = [sys.executable, "-m", "tbl_bench.child", str(cfg_path), str(res_path)]
        try:
            proc = subprocess.run(
                cmd, env=child_env, capture_output=True, text=True, timeout=config.timeout_s,
            )
        except subprocess.TimeoutExpired:
            return failed_result(config, f"timed out after {config.timeout_s:.0f} s")
        if proc.returncode != 0 or not res_path.exists():
            tail = (proc.stderr or "")[-_STDERR_TAIL:].strip()
            return failed_result(config, f"child exited with status {proc.returncode}: {tail}")
        return json.loads(res_path.read_text())


def parse_json_output(stdout: str) -> Any:
    """The JSON a script printed: all of stdout, or else its last line that parses as JSON."""
    text = stdout.strip()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    for line in reversed(text.splitlines()):
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            continue
    raise ValueError("no JSON found in the script's output")


def _run_script(config: Config, env: dict[str, str] | None) -> dict[str, Any]:
    module = config.target.partition(":")[0]
    cmd = [sys.executable, "-m", module, *config.args]
    child_env = dict(os.environ if env is None else env)
    try:
        proc = subprocess.run(cmd, env=child_env, capture_output=True, text=True, timeout=config.timeout_s)
    except subprocess.TimeoutExpired:
        return failed_result(config, f"timed out after {config.timeout_s:.0f} s")
    if proc.returncode != 0:
        tail = (proc.stderr or "")[-_STDERR_TAIL:].strip()
        return failed_result(config, f"{' '.join(cmd[1:])} exited with status {proc.returncode}: {tail}")
    try:
        payload = parse_json_output(proc.stdout)
    except ValueError as e:
        return failed_result(config, f"{' '.join(cmd[1:])}: {e}; stdout ends: {proc.stdout[-300:]!r}")
    return script_result(config, payload)


def run_configs(
    configs: Iterable[Config],
    *,
    on_result: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run configurations one after another (never concurrently: they would share the cores)."""
    results = []
    for config in configs:
        result = run_config(config)
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results
