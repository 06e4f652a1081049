"""mldiag: prewritten diagnostics for remote ML machines, one trustworthy answer per target."""

__version__ = "0.1.0"
