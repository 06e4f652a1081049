"""One run: the registry of diagnostics, a task's job, the fan-out over targets (threads,
worker processes), live progress and the run's own files. Imports core, inventory, transport and
views; never Invoke."""
