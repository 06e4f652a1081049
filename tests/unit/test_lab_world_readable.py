"""tests/lab/util.py's world_readable: the lab's copies of the checkout's test files (fakes,
fixtures) are readable by every lab user whatever modes the checkout has (a clone made under
umask 077 has 0700 directories and 0600 files)."""

import os
import stat

from tests.lab.util import world_readable


def mode(p) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def test_directories_and_executables_become_0755_other_files_0644_links_stay(tmp_path):
    top = tmp_path / "copy"
    (top / "hostile").mkdir(parents=True)
    run, data = top / "hostile" / "python", top / "capture.txt"
    run.write_text("#!/bin/sh\n")
    data.write_text("GPU 0\n")
    os.chmod(run, 0o700)
    os.chmod(data, 0o600)
    os.symlink("python", top / "hostile" / "link")
    os.chmod(top / "hostile", 0o700)
    os.chmod(top, 0o700)
    link_mode = mode(top / "hostile" / "link")
    world_readable(top)
    assert (mode(top), mode(top / "hostile"), mode(run), mode(data)) == (0o755, 0o755, 0o755, 0o644)
    assert mode(top / "hostile" / "link") == link_mode
    assert os.readlink(top / "hostile" / "link") == "python"


def test_group_or_other_execute_alone_does_not_make_a_file_executable(tmp_path):
    """Only the owner's execute bit says "a program" (git keeps 0755 or 0644, nothing between)."""
    f = tmp_path / "odd"
    f.write_text("x")
    os.chmod(f, 0o611)
    world_readable(tmp_path)
    assert mode(f) == 0o644
