"""hosts.yaml ``paths:`` (directories whose free space node-check's host check reads): read,
merged defaults → host → container by name, refused with file, line and key, and sent to the
node as one JSON token of the job's argv (the bundle, never a command line)."""

import json
import textwrap

import pytest

from diagnostics.builtin import BUILTIN
from diagnostics.core.errors import InputError
from diagnostics.engine import jobs, registry
from diagnostics.inventory import topology


def load(text):
    return topology.loads(textwrap.dedent(text), "hosts.yaml")


def error_of(text):
    with pytest.raises(InputError) as info:
        load(text)
    return str(info.value)


def test_paths_merge_by_name_and_the_inner_entry_wins():
    topo = load("""\
        defaults:
          paths:
            ckpt: {path: /ckpt, min_free_gb: 500}
            data: /datasets
        hosts:
          gpu1:
            paths:
              ckpt: {path: "/mnt/my ckpt", min_free_gb: 12.5}
            containers:
              train:
                runtime: docker
                id: train
                paths: {scratch: {path: /scratch, min_free_gb: 0}}
          gpu2: {}
        """)
    assert topo.targets["gpu1"].paths == (("ckpt", "/mnt/my ckpt", 12.5), ("data", "/datasets", None))
    assert topo.targets["train"].paths == (("ckpt", "/mnt/my ckpt", 12.5), ("data", "/datasets", None),
                                           ("scratch", "/scratch", 0.0))
    assert topo.targets["gpu2"].paths == (("ckpt", "/ckpt", 500.0), ("data", "/datasets", None))


@pytest.mark.parametrize("paths, where, message", [
    ("{ckpt: ckpt}", "4: hosts.a.paths.ckpt",
     "expected an absolute path, got 'ckpt'"),
    ("{ckpt: ~/ckpt}", "4: hosts.a.paths.ckpt",
     "expected an absolute path, got '~/ckpt' ('~' is not expanded on the node)"),
    ("{ckpt: {min_free_gb: 5}}", "4: hosts.a.paths.ckpt",
     "expected path: (an absolute directory on the node), e.g. {path: /ckpt, min_free_gb: 500}"),
    ("{ckpt: {path: /ckpt, min_free: 5}}", "4: hosts.a.paths.ckpt.min_free",
     "unknown key (did you mean 'min_free_gb'?)"),
    ("{ckpt: {path: /ckpt, min_free_gb: -1}}", "4: hosts.a.paths.ckpt.min_free_gb",
     "expected a number of GB of at least 0, got -1"),
    ("{ckpt: {path: /ckpt, min_free_gb: lots}}", "4: hosts.a.paths.ckpt.min_free_gb",
     "expected a number of GB of at least 0, got 'lots'"),
    ("{ckpt: [/ckpt]}", "4: hosts.a.paths.ckpt",
     "expected an absolute directory on the node, or {path: DIR, min_free_gb: GB}, got a list"),
    ("{-x: /ckpt}", "4: hosts.a.paths.-x", "'-x' is not a valid name"),
    ("[/ckpt]", "4: hosts.a.paths", "expected a mapping"),
])
def test_bad_paths_name_file_line_and_key(paths, where, message):
    got = error_of(f"""\
        hosts:
          a:
            address: a
            paths: {paths}
        """)
    assert got.startswith(f"hosts.yaml:{where}: {message}"), got


def test_a_bad_entry_on_its_own_line_is_named_by_that_line():
    got = error_of("""\
        defaults:
          paths:
            ckpt:
              path: /ckpt
              min_free_gb: true
        """)
    assert got.startswith("hosts.yaml:5: defaults.paths.ckpt.min_free_gb: expected a number of GB"), got


def test_paths_travel_as_one_json_token_of_the_jobs_argv():
    """A path with a space and a quote in it reaches the script's parser as it was written."""
    topo = load("""\
        hosts:
          gpu1:
            expect: {gpus: 8}
            paths:
              ckpt: {path: "/mnt/it's my ckpt", min_free_gb: 500}
        """)
    previous = registry.use(BUILTIN)     # the program's first step
    try:
        job = jobs.job_source("node-check", {})(topo.targets["gpu1"])
    finally:
        registry.use(previous)
    paths = [a for a in job.argv if a.startswith("--paths=")]
    assert len(paths) == 1
    assert json.loads(paths[0][len("--paths="):]) == [
        {"name": "ckpt", "path": "/mnt/it's my ckpt", "min_free_gb": 500.0}]
    assert "--expect={\"gpus\": 8}" in job.argv


def test_at_most_32_paths_in_one_mapping_and_in_all():
    many = ", ".join(f"p{i}: /p{i}" for i in range(33))
    assert error_of(f"hosts:\n  a:\n    paths: {{{many}}}\n") == "hosts.yaml:3: hosts.a.paths: 33 paths: at most 32"
    half = ", ".join(f"p{i}: /p{i}" for i in range(20))
    other = ", ".join(f"q{i}: /q{i}" for i in range(20))
    got = error_of(f"defaults:\n  paths: {{{half}}}\nhosts:\n  a:\n    paths: {{{other}}}\n")
    assert got.startswith("hosts.yaml:4: hosts.a: 40 paths in all (defaults, host and container together): "
                          "at most 32"), got
