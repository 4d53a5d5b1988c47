"""Adapters for the tools a user would pick instead of TBL, each behind the same workload protocol.

Every adapter module imports its tool lazily and raises `SkipConfig` with the
reason when the tool is not importable, so a run without the `[peers]` extra
reports "skipped: <why>" instead of failing.
"""
