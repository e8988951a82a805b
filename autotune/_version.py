"""The package version, kept apart so that any module may import it."""

__version__ = "0.1.0"
