"""URLs as an adversary or a typo writes them: unknown schemes, credentials in URLs, bad storage options.

Each case asserts the named error (and, for credentials, that no message or CLI line shows them).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import tbl_format
from tbl_loader import ImageLoader, PyTreeDataset, TokenLoader, convert
from tbl_loader.source.storage import is_url, open_store, redact

SECRET = "hunter2-SECRET"


@pytest.mark.parametrize("path", ["s4://bucket/x/", "S3x://b/k", "hdfs://cluster/data/"])
def test_a_scheme_tbl_does_not_read_is_refused_everywhere(tmp_path, path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="unknown URL scheme"):
        is_url(path)
    for make in (lambda: ImageLoader(path, 4), lambda: PyTreeDataset(path), lambda: TokenLoader(path, 2, 3)):
        with pytest.raises(ValueError, match="unknown URL scheme"):
            make()
    images = tmp_path / "images"
    (images / "a").mkdir(parents=True)
    from PIL import Image

    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(images / "a" / "x.png")
    with pytest.raises(ValueError, match="unknown URL scheme"):
        convert(images, path, size=8, workers=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images"]  # no local folder named after the scheme


def test_credentials_are_redacted_from_text():
    assert redact("s3://user:" + SECRET + "@host/b/k") == "s3://***@host/b/k"
    url = f"https://h.example/b/k.tbl?X-Amz-Signature={SECRET}&X-Amz-Credential={SECRET}&other=1"
    assert SECRET not in redact(url) and "other=1" in redact(url)
    assert SECRET not in redact(f"https://acct.blob.core.windows.net/c/k?sv=2024&sig={SECRET}")
    quoted = f"m.json%3FX-Amz-Signature%3D{SECRET}%26part%3D1 failed"  # as a library's message may quote it
    assert SECRET not in redact(quoted) and redact(quoted).endswith("%26part%3D1 failed")


def test_credentials_in_urls_reach_no_error_message(s3_server):
    url = f"{s3_server.endpoint}/nobucket/x.tbl?X-Amz-Signature={SECRET}".replace("http://", f"http://u:{SECRET}@")
    with pytest.raises(Exception) as info:
        open_store("s3://nobucket/data/", s3_server.storage_options).read_bytes(f"m.json?X-Amz-Signature={SECRET}")
    assert SECRET not in str(info.value)
    with pytest.raises(Exception) as info:
        PyTreeDataset(url, storage_options={"allow_http": "true"})
    assert SECRET not in str(info.value)


def test_the_cli_prints_no_credentials(s3_server, tmp_path):
    images = tmp_path / "images"
    (images / "a").mkdir(parents=True)
    from PIL import Image

    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(images / "a" / "x.png")
    dst = f"https://u:{SECRET}@127.0.0.1:9/b/ds.tbl?sig={SECRET}"
    run = subprocess.run([sys.executable, "-m", "tbl_format.cli", "convert", str(images), dst, "--size", "8",
                          "--workers", "1", "--quiet"], capture_output=True, text=True, timeout=300)
    assert run.returncode != 0
    assert SECRET not in run.stderr and SECRET not in run.stdout
    assert "***" in run.stderr


@pytest.mark.parametrize("options", [{"region": 5}, {"client_options": 5}, {"not_an_option": "x"}])
def test_bad_storage_options_are_a_named_value_error(options):
    with pytest.raises(ValueError, match="storage_options"):
        open_store("s3://bucket/prefix/", options)


def test_a_local_file_is_never_mistaken_for_a_url(tmp_path):
    path = tbl_format.write(({"x": i} for i in range(3)), tmp_path / "plain.tbl")
    assert not is_url(str(path)) and PyTreeDataset(str(path))[2] == {"x": 2}
