"""The version of edgekit, alone, so any layer can read it."""

__version__ = "0.3.0"
