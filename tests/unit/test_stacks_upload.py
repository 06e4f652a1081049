"""stacks ships py-spy only to a target that lacks one (diagnostics/builtin/stacks/upload.py), and the
runner's follow-up that carries it: checked on the real py-spy binary of this machine's
environment and on real local runs (a local target runs the same runtime a remote one does)."""

import os
import platform
import shutil
from dataclasses import replace

import pytest

from diagnostics.engine import bundle, runner
from diagnostics.builtin.stacks import upload as stacks_upload
from diagnostics.inventory.topology import Target
from tests.programs import result_of, space_free_python


def real_py_spy():
    found = stacks_upload.find_local_py_spy()
    if not found:
        pytest.fail("py-spy is not installed beside this Python (pip install -e '.[test]')")
    return found


def test_the_wheels_py_spy_is_a_static_binary_of_this_machine():
    with open(real_py_spy(), "rb") as f:
        assert stacks_upload.static_elf_machine(f.read()) == platform.machine()


@pytest.mark.parametrize("data", [b"", b"\x7fELF", b"#!/bin/sh\necho hi\n", b"\x7fELF" + b"\x01" * 60])
def test_anything_else_is_not_shippable(data):
    assert stacks_upload.static_elf_machine(data) is None


def test_a_dynamically_linked_program_is_not_shippable():
    """/bin/sh needs its loader and libc: it has a program interpreter."""
    with open(os.path.realpath(shutil.which("sh")), "rb") as f:
        assert stacks_upload.static_elf_machine(f.read()) is None


def job():
    return bundle.script_job("stacks", ["--pid=1"])


def result(data, status="ok"):
    return result_of("stacks", status=status, data=data)


def test_the_offer_and_the_follow_up():
    offered = stacks_upload.offer(job(), {}, binary=real_py_spy())
    assert offered.argv == ("--pid=1", f"--offer-py-spy={platform.machine()}")
    second = offered.follow_up(result({"wants_py_spy": True}))
    with open(real_py_spy(), "rb") as f:
        assert second.extra_files["py-spy"] == f.read()
    assert second.argv == ("--pid=1",) and second.follow_up is None      # asked once
    assert set(second.extra_files) == {"py-spy", "pyframes.py", "flight_recorder.py", "wait_frames.json", "_remote.py"}
    # nothing shipped unless asked in so many words, and never after an error
    for data, status in (({}, "ok"), ({"wants_py_spy": "yes"}, "ok"), ({"wants_py_spy": True}, "error"),
                         ("junk", "ok")):
        assert offered.follow_up(result(data, status)) is None


def test_no_offer_with_no_upload_or_without_a_shippable_binary(tmp_path):
    assert stacks_upload.offer(job(), {"no-upload": True}, binary=real_py_spy()) == job()
    script = tmp_path / "py-spy"
    script.write_text("#!/bin/sh\n")
    assert stacks_upload.offer(job(), {}, binary=str(script)) == job()


def test_the_runner_runs_the_follow_up_on_the_same_target_in_place_of_the_first(tmp_path):
    source = (b"import argparse, os\n"
              b"def build_parser():\n    return argparse.ArgumentParser()\n"
              b"def run(args):\n    here = os.path.dirname(os.path.abspath(__file__))\n"
              b"    return {'status': 'ok', 'summary': ' '.join(sorted(os.listdir(here)))}\n")
    seen = []

    def follow(first):
        seen.append(first)
        return replace(second_base, extra_files={"shipped.bin": b"\0\1"})

    second_base = bundle.Job(diagnostic="probe", script_name="probe.py", script_source=source,
                             argv=())
    first_job = bundle.Job(diagnostic="probe", script_name="probe.py", script_source=source,
                           argv=(), follow_up=follow)
    [r] = runner.run_many([Target(name="here", local=True, python=space_free_python())], first_job)
    assert [s.summary for s in seen] == ["probe.py"]         # the first run had no extra file
    assert r.status == "ok" and "shipped.bin" in r.summary.split()
    assert r.duration_s >= seen[0].duration_s
