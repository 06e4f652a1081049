"""The ``mldiag`` console script: the program imported with the cyclic GC off, and what it
imported then kept out of the collector's reach.

Measured with ``perf`` (2-core loopback machine, 20 runs): a one-target ``mldiag run-script``
spent ~56 ms of its ~0.32 s of client CPU in the cyclic GC. Imports allocate hundreds of
thousands of objects, so collections run throughout them, and every full collection later in
the run walks all of those objects again: modules, classes, functions and constants that live
until exit anyway. ``gc.freeze()`` moves them to the permanent generation, which no collection
visits (paramiko, imported at the first connection, gets the same through
``lean_imports.freeze_what_imports_load``). The collector is on again for what the run itself
makes: paramiko's transports, channels and tracebacks form cycles. A worker process forked
later also keeps the frozen objects' pages shared (a collection no longer writes to them).

In one interleaved A/B (this file vs. the plain entry, fleet bench's targets): one target 0.40 →
0.32 s wall, client CPU 0.33 → 0.26 s; 32 targets 1.61 → 1.42 s, client CPU 0.62 → 0.50 s.
"""

import gc


def start():
    """The program object, imported the cheap way (see the module docstring)."""
    gc.disable()
    try:
        from .program import program
        from ..core import lean_imports
    finally:
        gc.freeze()
        gc.enable()
    lean_imports.freeze_what_imports_load()
    return program


def main():
    start().run()
