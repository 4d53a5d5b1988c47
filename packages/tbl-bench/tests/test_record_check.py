"""tbl_bench.record_check end to end on a few photos: every layout written with its own library, converted with
one command each, equal row for row to the folder-with-sidecar conversion; a difference fails the check."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("skimage", reason="the generated photos need tbl-bench[photos]")
pytest.importorskip("sklearn", reason="the generated photos need tbl-bench[photos]")
pytest.importorskip("webdataset", reason="the WebDataset layout is written with webdataset's ShardWriter")
pytest.importorskip("pyarrow", reason="the Parquet layout is written with pyarrow")
pytest.importorskip("datasets", reason="the datasets layout is written with datasets' save_to_disk")

from tbl_bench.record_check import PEER, SOURCES, caption, main

IMAGES = 40


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    """One round of every source at 40 photos, --size 32: (data dir, exit status, the JSON written)."""
    data = tmp_path_factory.mktemp("record-check")
    out = data / "result.json"
    rc = main(["--data-dir", str(data), "--images", str(IMAGES), "--size", "32", "--rounds", "1",
               "--workers", "2", "--json", str(out)])
    return data, rc, json.loads(out.read_text())


def test_every_layout_converts_equal_to_the_folder(checked, capsys):
    _, rc, result = checked
    assert rc == 0, result["failures"]
    assert result["failures"] == {}
    assert result["checks"] == {name: None for name in SOURCES if name != "folder"}
    table = {row["source"]: row for row in result["table"]}
    assert set(table) == set(SOURCES) and PEER not in table
    assert table["tar"]["vs_tar"] == 1.0
    assert all(row["rounds"] == 1 and row["seconds"] > 0 and row["cpu_seconds"] > 0 for row in table.values())
    assert table["tar"]["vs_tar_cpu"] == 1.0


def test_layouts_hold_the_captions_and_labels(checked):
    data, _, _ = checked
    root = data / f"records-{IMAGES}"
    lines = [json.loads(line) for line in (root / "manifest.jsonl").read_text().splitlines()]
    side = json.loads((root / "captions.json").read_text())
    assert len(lines) == len(side) == IMAGES
    assert [line["path"] for line in lines] == sorted(f"folder/{name}" for name in side)
    for i, line in enumerate(lines):
        name = line["path"].removeprefix("folder/")
        assert line["caption"] == side[name]["caption"] == caption(i, name)
    assert any(not line["caption"].isascii() for line in lines)  # non-ASCII text goes through every layout
    classes = sorted({line["path"].split("/")[1] for line in lines})
    assert [line["label"] for line in lines] == [classes.index(line["path"].split("/")[1]) for line in lines]
    assert sorted(p.name for p in (root / "webdataset").iterdir()) == ["shard-000000.tar"]
    assert not list(root.glob(".record-check-*")), "the converted datasets are removed"


def test_a_source_that_differs_fails_the_check(checked, capsys):
    data, _, _ = checked
    manifest = data / f"records-{IMAGES}" / "manifest.jsonl"
    original = manifest.read_text()
    lines = original.splitlines()
    row = json.loads(lines[7])
    row["caption"] += " (edited)"
    lines[7] = json.dumps(row)
    manifest.write_text("\n".join(lines) + "\n")
    try:
        assert main(["--data-dir", str(data), "--images", str(IMAGES), "--size", "32", "--rounds", "1",
                     "--workers", "1", "--sources", "manifest"]) == 1
    finally:
        manifest.write_text(original)
    out = capsys.readouterr().out
    assert "manifest: row 7: caption" in out and "(edited)" in out


def test_a_peer_interpreter_that_cannot_run_litdata_is_reported(tmp_path, checked, capsys):
    data, _, _ = checked
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'no litdata here' >&2\nexit 3\n")
    fake.chmod(0o755)
    assert main(["--data-dir", str(data), "--images", str(IMAGES), "--size", "32", "--rounds", "2",
                 "--workers", "1", "--sources", "tar", "--peer-python", str(fake)]) == 0
    out = capsys.readouterr().out
    assert f"{PEER}: FAILED" in out and "no litdata here" in out
    assert "| tar |" in out and f"| {PEER} |" not in out


def test_arguments_are_checked(tmp_path):
    with pytest.raises(SystemExit):
        main(["--data-dir", str(tmp_path), "--sources", "tar,lmdb"])
    with pytest.raises(SystemExit):
        main(["--data-dir", str(tmp_path), "--peer-python", str(tmp_path / "missing")])


def test_the_peer_is_timed_in_every_round_and_read_against_the_parquet(tmp_path, checked, capsys):
    """A stand-in peer interpreter that answers what litdata_optimize_parquet returns: the rows written."""
    data, _, _ = checked
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\nfor last; do :; done\necho {IMAGES} > "$last"\n')
    fake.chmod(0o755)
    out = tmp_path / "peer.json"
    assert main(["--data-dir", str(data), "--images", str(IMAGES), "--size", "32", "--rounds", "2",
                 "--workers", "1", "--sources", "parquet", "--peer-python", str(fake), "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert len(result["seconds"][PEER]) == 2 and all(s > 0 for s in result["seconds"][PEER])
    assert result["parquet_vs_peer"][0] > 0
    assert f"| {PEER} |" in capsys.readouterr().out
