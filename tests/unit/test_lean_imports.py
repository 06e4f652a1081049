"""Invoke and paramiko imported without unittest.mock, Invoke's vendored PyYAML and
importlib.metadata (diagnostics/core/lean_imports.py), and still the same libraries: each check that
needs a fresh interpreter runs in one (this process has them all loaded already)."""

import json
import os
import subprocess
import sys
import types

import pytest

from diagnostics.core import lean_imports
from diagnostics.core.lean_imports import distribution_version


def fresh(code: str) -> dict:
    """Run ``code`` in a new interpreter; it prints one JSON document."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_mldiag_command_imports_invoke_without_mock_asyncio_or_a_second_yaml():
    found = fresh("""
import json, sys
import diagnostics.cli.program
import invoke, invoke.util, yaml
loaded = {name: name in sys.modules for name in
          ("unittest.mock", "unittest", "asyncio", "invoke.vendor.yaml", "importlib.metadata")}
context = invoke.MockContext(run=invoke.Result("hello"))
out = context.run("anything").stdout
print(json.dumps({"loaded": loaded, "yaml_is_pyyaml": invoke.util.yaml is yaml,
                  "mock_type": type(context.run).__module__ + "." + type(context.run).__name__,
                  "mock_out": out, "mock_now": "unittest.mock" in sys.modules}))
""")
    assert found["loaded"] == {"unittest.mock": False, "unittest": False, "asyncio": False,
                               "invoke.vendor.yaml": False, "importlib.metadata": False}
    assert found["yaml_is_pyyaml"]
    # MockContext (a testing aid) still gets the real unittest.mock.Mock, imported when used
    assert found["mock_type"] == "unittest.mock.Mock"
    assert found["mock_out"] == "hello" and found["mock_now"]


def test_pyyamls_pure_python_reader_compiles_its_pattern_when_used_and_still_refuses():
    found = fresh("""
import json, re, sys
import diagnostics.cli.program
import yaml, yaml.reader
pattern = yaml.reader.Reader.NON_PRINTABLE
lazy = not isinstance(pattern, re.Pattern)
compile_restored = re.compile.__module__ == "re"
loaded = yaml.load("a: [1, two]", Loader=yaml.SafeLoader)       # the pure-Python reader
try:
    yaml.load("a: b\\x07", Loader=yaml.SafeLoader)
    refused = None
except yaml.reader.ReaderError as exc:
    refused = str(exc)
print(json.dumps({"lazy": lazy, "restored": compile_restored, "loaded": loaded,
                  "refused": refused, "now": type(pattern._compiled).__name__}))
""")
    assert found["lazy"] and found["restored"]
    assert found["loaded"] == {"a": [1, "two"]}
    assert "unacceptable character #x0007" in found["refused"] and found["now"] == "Pattern"


def test_a_lazy_pattern_is_the_pattern():
    pattern = lean_imports.LazyPattern("[^a-z]", 0)
    assert pattern._compiled is None
    assert pattern.search("abc1").group() == "1" and pattern.pattern == "[^a-z]"
    assert pattern.sub("", "a-b") == "ab"


def test_paramiko_imported_lean_has_its_real_version_and_banner():
    found = fresh("""
import json, sys
from diagnostics.core import lean_imports
paramiko = lean_imports.import_paramiko()
before = "importlib.metadata" in sys.modules
import paramiko.transport
banner = paramiko.transport.Transport._CLIENT_ID
from importlib import metadata
print(json.dumps({"before": before, "version": paramiko.__version__, "banner": banner,
                  "real": metadata.version("paramiko"), "unittest": "unittest" in sys.modules}))
""")
    assert found["before"] is False and found["unittest"] is False
    assert found["version"] == found["real"]
    assert found["banner"] == "paramiko_" + found["real"]


def test_with_invoke_already_loaded_nothing_is_replaced():
    import invoke
    import invoke.util
    assert lean_imports.import_invoke() is invoke
    assert "unittest.mock" not in sys.modules or not isinstance(sys.modules["unittest.mock"],
                                                                lean_imports._LazyStandIn)


def write_dist(site, dirname, metadata):
    d = site / dirname
    d.mkdir()
    if metadata is not None:
        (d / "METADATA").write_text(metadata)


def test_distribution_version_reads_the_one_dist_info_beside_the_package(tmp_path):
    write_dist(tmp_path, "paramiko-5.1.0.dist-info",
               "Metadata-Version: 2.1\nName: paramiko\nVersion: 5.1.0\n\nVersion: 9.9 (the body)\n")
    write_dist(tmp_path, "Foo.Bar_baz-2.0rc1.dist-info", "Name: foo-bar-baz\nVersion: 2.0rc1\n")
    write_dist(tmp_path, "paramiko_ng-1.0.dist-info", "Version: 1.0\n")   # another project
    assert distribution_version("paramiko", str(tmp_path)) == "5.1.0"
    assert distribution_version("foo-bar.baz", str(tmp_path)) == "2.0rc1"
    assert distribution_version("Foo-Bar-Baz", str(tmp_path)) == "2.0rc1"


@pytest.mark.parametrize("dists", [
    [],                                                            # none: not this way
    [("pkg-1.0.dist-info", "Version: 1.0\n"), ("pkg-2.0.dist-info", "Version: 2.0\n")],  # two
    [("pkg-1.0.dist-info", None)],                                 # no METADATA
    [("pkg-1.0.dist-info", "Name: pkg\n\nVersion: 1.0\n")],        # Version only in the body
])
def test_distribution_version_gives_up_where_importlib_metadata_must_answer(tmp_path, dists):
    for dirname, metadata in dists:
        write_dist(tmp_path, dirname, metadata)
    assert distribution_version("pkg", str(tmp_path)) is None
    assert distribution_version("pkg", str(tmp_path / "missing")) is None


def test_a_stand_in_answers_its_own_names_and_hands_the_rest_to_the_real_module(monkeypatch):
    name = "json"   # any real module: the stand-in takes its place in sys.modules
    monkeypatch.setitem(sys.modules, name, lean_imports._LazyStandIn(name, {"mine": 1}))
    stand_in = sys.modules[name]
    assert stand_in.mine == 1
    with pytest.raises(AttributeError):
        stand_in.__path__            # the import system asking, not a use: no real import
    assert sys.modules[name] is stand_in
    assert stand_in.dumps([1]) == "[1]"   # any other name: the real module, now in sys.modules
    assert sys.modules[name] is not stand_in and isinstance(sys.modules[name], types.ModuleType)


def test_stand_ins_are_taken_out_even_when_the_import_fails(monkeypatch):
    monkeypatch.delitem(sys.modules, "mldiag_no_such_module", raising=False)
    made = []

    def make():
        made.append(lean_imports._LazyStandIn("mldiag_stand_in_probe", {}))
        return made[-1]
    with pytest.raises(ImportError):
        lean_imports._import_with("mldiag_no_such_module", {"mldiag_stand_in_probe": make})
    assert made and "mldiag_stand_in_probe" not in sys.modules


def test_the_console_script_freezes_what_it_and_paramiko_import_and_keeps_the_collector_on():
    found = fresh("""
import gc, json, tomllib
from diagnostics.cli import entry
from diagnostics.core import lean_imports
program = entry.start()
after_start = {"enabled": gc.isenabled(), "frozen": gc.get_freeze_count(),
               "program_frozen": not any(o is program for o in gc.get_objects())}
lean_imports.import_paramiko()
after_paramiko = {"enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}
class Cycle: pass
a = Cycle(); a.self = a; del a
print(json.dumps({"start": after_start, "paramiko": after_paramiko, "collected": gc.collect(),
                  "script": tomllib.load(open("pyproject.toml", "rb"))["project"]["scripts"]}))
""")
    start, after = found["start"], found["paramiko"]
    assert start["enabled"] and after["enabled"]
    # the program's own objects (its modules, Invoke's, PyYAML's) are out of every collection
    assert start["program_frozen"] and start["frozen"] > 20000
    # paramiko and cryptography, imported at the first connection, join them
    assert after["frozen"] > start["frozen"] + 5000
    # what the run itself makes is still collected
    assert found["collected"] >= 1
    assert found["script"]["mldiag"] == "diagnostics.cli.entry:main"


def test_a_library_caller_keeps_its_own_collector_untouched():
    found = fresh("""
import gc, json
from diagnostics.core import lean_imports
import diagnostics.cli.program
lean_imports.import_paramiko()
print(json.dumps({"enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}))
""")
    assert found == {"enabled": True, "frozen": 0}


@pytest.mark.parametrize("flags, writes", [([], True), (["-B"], False)])
def test_the_console_script_leaves_pythons_bytecode_setting_as_it_found_it(flags, writes, tmp_path):
    """Invoke turns .pyc writing off when it parses its flags (its --write-pyc). mldiag keeps
    Python's own setting: modules imported later (paramiko at the first connection) get a .pyc
    the next run reads, where PYTHONPYCACHEPREFIX points away from site-packages' copies."""
    prefix = tmp_path / "pycache"
    code = f"""
import json, sys
from diagnostics.cli.program import program
program.parse_core(["mldiag", "hosts"])
setting = sys.dont_write_bytecode
import {LATE_MODULE}   # a stdlib module nothing had imported yet
print(json.dumps({{"dont_write": setting}}))
"""
    proc = subprocess.run([sys.executable, *flags, "-c", code], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, PYTHONPYCACHEPREFIX=str(prefix),
                                              PYTHONDONTWRITEBYTECODE=""))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"dont_write": not writes}
    written = sorted(p.name for p in prefix.rglob(f"{LATE_MODULE}.*.pyc"))
    assert bool(written) is writes, written


LATE_MODULE = "wave"
