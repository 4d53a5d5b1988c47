"""tbl-bench: benchmark suites and their runner, peer comparisons, reports and charts, and the demo."""

from tbl_bench.bench import run_bench
from tbl_bench.config import Config, SkipConfig
from tbl_bench.context import BenchContext
from tbl_bench.data import make_image_tar
from tbl_bench.fingerprint import machine_fingerprint
from tbl_bench.report import write_report
from tbl_bench.results import SCHEMA, load_results
from tbl_bench.rss import RssSampler
from tbl_bench.runner import run_config

__version__ = "0.1.0"

__all__ = [
    "BenchContext",
    "Config",
    "RssSampler",
    "SCHEMA",
    "SkipConfig",
    "__version__",
    "load_results",
    "machine_fingerprint",
    "make_image_tar",
    "run_bench",
    "run_config",
    "write_report",
]
