"""An empty class folder: refused by name (EmptyClassError, CLI exit 2, nothing written), or kept with its label
index under allow_empty_classes / --allow-empty-classes, and then named in the report."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from convert_images import jpeg_set, run_cli, write_tree

import tbl_format
from tbl_loader import convert
from tbl_loader.errors import EmptyClassError, SourceError

S = 16


@pytest.fixture(scope="module")
def photos() -> list[bytes]:
    return jpeg_set(5, seed=3, lo=30, hi=50)


def _tree(root: Path, photos: list[bytes]) -> Path:
    """Classes a (2 images), b (empty folder), c (1 image), d (only a text file): b and d are empty."""
    write_tree(root, {"a/0.jpg": photos[0], "a/1.jpg": photos[1], "c/0.jpg": photos[2], "d/notes.txt": b"x"})
    (root / "b").mkdir()
    return root


def _labels_and_classes(path: Path) -> tuple[np.ndarray, list[str]]:
    with tbl_format.open(path) as ds:
        labels = np.concatenate([np.asarray(s) for s in ds.segments("label")])
        return labels, ds.metadata["classes"]


def test_an_empty_class_folder_is_refused_by_name_and_nothing_is_written(tmp_path, photos):
    src = _tree(tmp_path / "src", photos)
    dst = tmp_path / "out" / "ds.tbl"
    with pytest.raises(EmptyClassError) as refused:
        convert(src, dst, S, workers=1, progress=False)
    message = str(refused.value)
    assert repr(str(src / "b")) in message and repr(str(src / "d")) in message and "2 class folder(s)" in message
    assert repr(str(src / "a")) not in message and "allow_empty_classes=True" in message
    assert isinstance(refused.value, SourceError)  # refused like any unusable source
    assert not dst.exists() and not Path(f"{dst}.report.json").exists()


def test_allowed_empty_classes_keep_their_label_index_and_are_reported(tmp_path, photos):
    src = _tree(tmp_path / "src", photos)
    dst = tmp_path / "ds.tbl"
    rep = convert(src, dst, S, workers=1, progress=False, allow_empty_classes=True)
    labels, classes = _labels_and_classes(dst)
    assert classes == ["a", "b", "c", "d"]  # from the whole source, empty ones included
    assert labels.tolist() == [0, 0, 2]  # c keeps index 2 although b before it is empty
    assert rep.empty_classes == ["b", "d"] and rep.classes == 4
    assert json.loads(Path(f"{dst}.report.json").read_text())["empty_classes"] == ["b", "d"]
    assert "2 empty class folder(s) kept with their label: b, d" in rep.summary()


def test_a_part_of_the_source_keeps_the_whole_sources_classes(tmp_path, photos):
    src = _tree(tmp_path / "src", photos)
    convert(src, tmp_path / "p1", S, workers=1, progress=False, part="1/2", shards=1, allow_empty_classes=True)
    labels, classes = _labels_and_classes(tmp_path / "p1")
    assert classes == ["a", "b", "c", "d"] and labels.tolist() == [0, 2]  # rows 1..2 of a/0, a/1, c/0


def test_a_source_without_empty_classes_is_unaffected(tmp_path, photos):
    src = write_tree(tmp_path / "src", {"a/0.jpg": photos[0], "b/0.jpg": photos[1]})
    rep = convert(src, tmp_path / "ds.tbl", S, workers=1, progress=False)
    assert rep.empty_classes == [] and _labels_and_classes(tmp_path / "ds.tbl")[0].tolist() == [0, 1]


def test_cli_refuses_with_one_line_and_exit_2_then_allows_and_force_replaces(tmp_path, photos):
    src = _tree(tmp_path / "src", photos)
    dst = tmp_path / "ds.tbl"
    refused = run_cli(str(src), str(dst), "--size", str(S), "--workers", "1", "--quiet")
    assert refused.returncode == 2, refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and str(src / "b") in lines[0] and "--allow-empty-classes" in lines[0]
    assert "nothing was written" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]  # no dataset, no report, no temporary file

    ok = run_cli(str(src), str(dst), "--size", str(S), "--workers", "1", "--allow-empty-classes")
    assert ok.returncode == 0, ok.stderr
    assert "2 empty class folder(s) kept with their label: b, d" in ok.stderr
    first = _labels_and_classes(dst)

    # An existing dataset: refused without --force whatever the classes, and an empty class is refused
    # before --force removes anything; --force with --allow-empty-classes replaces it.
    again = run_cli(str(src), str(dst), "--size", str(S), "--workers", "1", "--allow-empty-classes", "--quiet")
    assert again.returncode == 2 and "--force" in again.stderr
    (src / "a" / "1.jpg").unlink()  # the source changes: its dataset would have 2 rows
    forced = run_cli(str(src), str(dst), "--size", str(S), "--workers", "1", "--force", "--quiet")
    assert forced.returncode == 2 and str(src / "b") in forced.stderr
    assert np.array_equal(_labels_and_classes(dst)[0], first[0])  # the existing dataset is untouched
    replaced = run_cli(str(src), str(dst), "--size", str(S), "--workers", "1", "--force", "--allow-empty-classes",
                       "--quiet")
    assert replaced.returncode == 0, replaced.stderr
    assert _labels_and_classes(dst)[0].tolist() == [0, 2]
