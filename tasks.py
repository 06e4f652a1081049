"""Hands mldiag's task namespace to Invoke: `inv --list`, `inv gpu-status -H trainbox`."""

from diagnostics.tasks import ns  # noqa: F401
