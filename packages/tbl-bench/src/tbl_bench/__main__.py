import sys

from tbl_bench.cli import main

sys.exit(main())
