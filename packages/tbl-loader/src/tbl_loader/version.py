"""The tbl-loader release (one place: the build reads it from here, the package and its metadata from the build)."""

__version__ = "0.1.0"
