"""The package version, in a module of its own: run files name it, and nothing need import the package."""

__version__ = "0.1.0"
