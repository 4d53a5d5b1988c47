import pytest

from tbl_bench.context import BenchContext, DataUnavailable, Sizes
from tbl_bench.harness import Config
from tbl_bench.suites import SUITES, load_suite


@pytest.mark.parametrize("name", list(SUITES))
def test_every_suite_has_the_suite_attributes(name):
    suite = load_suite(name)
    assert suite.NAME == name
    assert isinstance(suite.TITLE, str) and suite.TITLE
    assert isinstance(suite.COMPARE_ON, tuple)
    assert callable(suite.configurations)


def test_unknown_suite():
    with pytest.raises(KeyError, match="unknown suite"):
        load_suite("nope")


class _Ctx(BenchContext):
    """A context whose inputs are never built: TBL data is unavailable, the TAR is a name only."""

    def image_tar(self):
        return self.data_dir / "photos.tar"

    def tbl_images(self, size=None, mode="squash"):
        raise DataUnavailable("tbl_loader.convert is not importable: test")

    def tbl_rows(self, kind):
        raise DataUnavailable("tbl_format.write is not available: test")

    def pickled_rows(self, kind):
        return self.data_dir / f"{kind}.pkl"


@pytest.fixture
def ctx(tmp_path):
    return _Ctx(tmp_path, sizes=Sizes(images=10, classes=2, image_size=32, batch_size=4, scalar_rows=10,
                                      array_rows=10, warmup=1, epochs=2))


@pytest.mark.parametrize("name", ["images", "convert", "pytree", "torch", "resident", "train"])
def test_configurations_skip_with_the_reason_when_inputs_are_missing(ctx, name, monkeypatch):
    import tbl_bench.suites.resident

    monkeypatch.setattr(tbl_bench.suites.resident, "pick_device", lambda: "cpu")  # no torch import here
    configs = load_suite(name).configurations(ctx)
    assert configs and all(isinstance(c, Config) and c.suite == name for c in configs)
    assert len({c.name for c in configs}) == len(configs)
    tbl = [c for c in configs if c.tool == "tbl" and c.target != "tbl_bench.suites.convert:tbl_convert"]
    assert all("test" in c.skip for c in tbl)
    # The references that do not need TBL's data still run.
    assert name in ("resident", "convert") or any(c.skip is None for c in configs)


def test_images_suite_compares_like_with_like(ctx):
    configs = load_suite("images").configurations(ctx)
    for c in configs:
        if c.role != "floor":
            assert {"level", "aug"} <= set(c.params)
    assert {c.role for c in configs} == {"subject", "baseline", "floor"}
