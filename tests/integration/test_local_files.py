"""What a root `mldiag` run writes on this machine, against an unprivileged local user (issue 10
item 1; issue 11 item 10). The user `nobody` (through `runuser`) works in a shared directory
(mode 1777, like /tmp): it pre-creates the --save directory, or plants symbolic links in it
(`NAME.json.part`, `summary.json.part`, `report.md`, `steps`, ...) pointing at root's files. Root
then runs the real `mldiag` program against the lab (`main`, over ssh) and the local machine:

- a directory that root does not own, that others can write, or a link in its place: exit 4,
  nothing written, and no target asked anything — a third target `watched` is a TCP listener
  that counts connections (none), and the run's audit record of command lines stays empty;
- links left inside a directory that is root's and private by the time of the run (planted
  while it was shared): the run writes its files in their place, the links' targets keep their
  content, and every target's result is in the table and in the directory.
"""

import json
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import textwrap
import threading
from pathlib import Path

import pytest

from tests.programs import mldiag

REPO = Path(__file__).resolve().parents[2]
RECORD_ENV = "MLDIAG_RECORD_COMMANDS"
NOBODY = pwd.getpwnam("nobody")
# what nobody plants: every name a run writes, and the temp names the old code used
PLANTED = ("main.json", "main.json.part", "local.json.part", "summary.json", "summary.json.part",
           "report.md", "report.json")


class Listener:
    """A TCP port that counts the connections made to it (the `watched` target)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()


@pytest.fixture(scope="module")
def watched():
    listener = Listener()
    yield listener
    listener.sock.close()


@pytest.fixture(scope="module")
def hosts_file(lab, watched, tmp_path_factory):
    books = tmp_path_factory.mktemp("books")
    (books / "twice.yaml").write_text(textwrap.dedent("""\
        description: ping, then ping again
        steps:
          - task: ping
          - id: again
            task: ping
        """))
    return lab.hosts_yaml(textwrap.dedent(f"""\
        defaults: {{connect_timeout: 3, timeout: 60}}
        runbooks: {books}
        hosts:
          main: {{}}
          watched: {{address: 127.0.0.1, port: {watched.port}, user: mlsh}}
        """))


@pytest.fixture
def shared():
    """A directory everyone can write, sticky, as /tmp is (nobody cannot reach pytest's tmp)."""
    if not shutil.which("runuser"):
        pytest.fail("runuser (util-linux) is needed to act as nobody")
    d = Path(tempfile.mkdtemp(prefix="mldiag-shared-", dir="/tmp"))
    os.chmod(d, 0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def victim(tmp_path):
    """Root's files that a planted link points at (nobody cannot read or write them)."""
    d = tmp_path / "root-only"
    d.mkdir(mode=0o700)
    for name in ("crontab", "profile"):
        (d / name).write_text(f"root's {name}\n")
    return d


def as_nobody(*argv):
    subprocess.run(["runuser", "-u", "nobody", "--", *map(str, argv)], check=True,
                   capture_output=True, text=True)


def plant(directory, victim, names=PLANTED, steps=False):
    for name in names:
        as_nobody("ln", "-s", victim / "crontab", directory / name)
    if steps:
        as_nobody("ln", "-s", victim, directory / "steps")


def state(directory):
    """Each entry: a link and where it points, or a file's content, or a directory."""
    out = {}
    for name in sorted(os.listdir(directory)):
        p = directory / name
        out[name] = (("link", os.readlink(p)) if p.is_symlink() else
                     ("dir",) if p.is_dir() else ("file", p.read_text()))
    return out


def recorded_mldiag(*argv, record, timeout=120):
    """The real program as root; its audit record goes to ``record`` (then into the suite's)."""
    r = mldiag(*argv, timeout=timeout, env={RECORD_ENV: str(record)})
    suite = os.environ.get(RECORD_ENV)
    if suite and record.exists():
        with open(suite, "a") as f:
            f.write(record.read_text())
    return r


def assert_refused_before_connecting(r, record, watched, message):
    assert (r.returncode, r.stdout, r.stderr) == (4, "", f"mldiag: {message}\n")
    assert watched.accepted == 0
    assert not record.exists() or record.read_text() == ""


RUNS = {"ping": ["ping", "-H", "main,local,watched"],
        "runbook": ["runbook", "twice", "-H", "main,local,watched"]}


@pytest.mark.parametrize("task", RUNS)
def test_a_directory_nobody_made_is_refused_before_connecting(hosts_file, shared, victim, watched,
                                                               tmp_path, task):
    out = shared / "out"
    as_nobody("mkdir", "-m", "755", out)
    plant(out, victim, steps=True)
    before = state(out)
    r = recorded_mldiag(*RUNS[task], "--hosts-file", hosts_file, "--save", out, record=tmp_path / "rec")
    assert_refused_before_connecting(
        r, tmp_path / "rec", watched, f"--save {out}: owned by nobody (uid {NOBODY.pw_uid}), "
                                      f"not by you (root (uid 0)); name a directory of your own")
    assert state(out) == before and state(victim) == {"crontab": ("file", "root's crontab\n"),
                                                      "profile": ("file", "root's profile\n")}


@pytest.mark.parametrize("bits", [0o777, 0o1777, 0o775], ids=["0777", "1777", "0775"])
def test_a_directory_others_can_write_is_refused_before_connecting(hosts_file, shared, victim,
                                                                    watched, tmp_path, bits):
    out = shared / "out"
    out.mkdir()
    os.chmod(out, bits)
    if bits & 0o002:
        plant(out, victim)
    before = state(out)
    who = "its group and others" if bits & 0o002 else "its group"
    r = recorded_mldiag(*RUNS["ping"], "--hosts-file", hosts_file, "--save", out, record=tmp_path / "rec")
    assert_refused_before_connecting(
        r, tmp_path / "rec", watched, f"--save {out}: writable by {who} (mode {bits:04o}); make it "
                                      "private (chmod go-w) or name another directory")
    assert state(out) == before and (victim / "crontab").read_text() == "root's crontab\n"


def test_a_link_in_place_of_the_directory_is_refused_before_connecting(hosts_file, shared, watched,
                                                                       tmp_path):
    roots = tmp_path / "roots-private"          # root's own private directory, a fine target
    roots.mkdir(mode=0o700)
    out = shared / "out"
    as_nobody("ln", "-s", roots, out)
    r = recorded_mldiag(*RUNS["runbook"], "--hosts-file", hosts_file, "--save", out, record=tmp_path / "rec")
    assert_refused_before_connecting(r, tmp_path / "rec", watched,
                                     f"--save {out}: a symbolic link; name the directory itself")
    assert os.listdir(roots) == []


def test_a_steps_link_left_in_a_private_directory_is_refused_before_connecting(
        hosts_file, shared, victim, watched, tmp_path):
    out = shared / "out"
    out.mkdir()
    os.chmod(out, 0o777)
    plant(out, victim, steps=True)
    os.chmod(out, 0o700)                       # private again, but what was planted stays
    r = recorded_mldiag(*RUNS["runbook"], "--hosts-file", hosts_file, "--save", out, record=tmp_path / "rec")
    assert_refused_before_connecting(r, tmp_path / "rec", watched,
                                     f"--save {out}/steps: a symbolic link; name the directory itself")
    assert sorted(os.listdir(victim)) == ["crontab", "profile"]


def test_a_file_or_a_path_through_a_file_is_refused_before_connecting(hosts_file, watched, tmp_path):
    (tmp_path / "file").write_text("keep\n")
    for save in (tmp_path / "file", tmp_path / "file" / "sub"):
        r = recorded_mldiag(*RUNS["ping"], "--hosts-file", hosts_file, "--save", save, record=tmp_path / "rec")
        assert_refused_before_connecting(r, tmp_path / "rec", watched,
                                         f"--save {save}: not a directory")
    assert (tmp_path / "file").read_text() == "keep\n"


def test_links_left_in_a_private_directory_are_replaced_not_followed(hosts_file, shared, victim,
                                                                      tmp_path):
    out = shared / "out"
    out.mkdir()
    os.chmod(out, 0o777)
    plant(out, victim)
    os.chmod(out, 0o755)
    r = recorded_mldiag("ping", "-H", "main,local", "--hosts-file", hosts_file, "--save", out,
                        record=tmp_path / "rec")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [line.split() for line in r.stdout.split("\n\n")[0].splitlines()[1:]
            if not line.startswith(" ")]
    assert {name for row in rows if row[1] == "ok" for name in row[0].split(",")} == {"main", "local"}
    assert r.stdout.endswith("\n2 ok\n"), r.stdout
    for name in ("main.json", "local.json"):
        assert not (out / name).is_symlink() and json.loads((out / name).read_text())["status"] == "ok"
    assert json.loads((out / "summary.json").read_text())["targets"] == {"main": "ok", "local": "ok"}
    assert oct(os.lstat(out / "main.json").st_mode & 0o777) == "0o600"

    r = recorded_mldiag("runbook", "twice", "-H", "main,local", "--hosts-file", hosts_file, "--save", out,
                        record=tmp_path / "rec2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert not (out / "report.md").is_symlink() and (out / "report.md").read_text() == r.stdout
    assert json.loads((out / "report.json").read_text())["exit_code"] == 0
    for step in ("01-ping", "02-again"):
        assert sorted(os.listdir(out / "steps" / step)) == ["local.json", "main.json", "summary.json"]
    assert oct(os.lstat(out / "steps").st_mode & 0o777) == "0o700"
    # the links planted under temp names are left alone, and what they point at is untouched
    assert {n: v for n, v in state(out).items() if v[0] == "link"} == {
        n: ("link", str(victim / "crontab")) for n in ("main.json.part", "local.json.part",
                                                        "summary.json.part")}
    assert state(victim) == {"crontab": ("file", "root's crontab\n"),
                             "profile": ("file", "root's profile\n")}
