"""savedir.SaveDir (issue 10 item 1, issue 11 item 10): the ``--save`` directory is created 0700 or
refused unless it is ours and private; every write goes through its fd with O_EXCL|O_NOFOLLOW and
a rename, so nothing planted in it is ever followed. Then the same through the real `mldiag`
program (a local target whose interpreter leaves a mark when it is started): a refused --save is
exit 4 before any target is asked anything. (tests/integration/test_local_files.py plays the
attacks as an unprivileged user against a root run on the lab.)"""

import json
import os
import signal
import stat
import subprocess

import pytest

from diagnostics.core import termination
from diagnostics.core.errors import InputError
from diagnostics.core.savedir import SaveDir, result_file_name
from tests.programs import marking_python, mldiag

ROOT = os.geteuid() == 0


def mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


def refused(path, message):
    with pytest.raises(InputError) as exc:
        SaveDir.open(str(path))
    assert str(exc.value) == f"--save {path}: {message}"
    assert exc.value.exit_code == 4


@pytest.fixture
def victim(tmp_path):
    """A file that a planted link points at: it must keep its content."""
    v = tmp_path / "victim"
    v.mkdir()
    (v / "crontab").write_text("original\n")
    return v / "crontab"


def test_a_new_directory_and_its_parents_are_made_and_it_is_private(tmp_path):
    old = os.umask(0o022)
    try:
        with SaveDir.open(str(tmp_path / "a" / "b" / "out")) as save:
            save.write_json("x.json", {"k": 1})
    finally:
        os.umask(old)
    assert mode(tmp_path / "a" / "b" / "out") == 0o700
    assert mode(tmp_path / "a" / "b" / "out" / "x.json") == 0o600
    assert json.loads((tmp_path / "a" / "b" / "out" / "x.json").read_text()) == {"k": 1}
    assert os.listdir(tmp_path / "a" / "b" / "out") == ["x.json"]    # no temp, no probe left


def test_an_existing_private_directory_of_ours_is_used_as_it_is(tmp_path):
    (tmp_path / "out").mkdir(mode=0o755)
    os.chmod(tmp_path / "out", 0o755)
    (tmp_path / "out" / "old.json").write_text("{}")
    with SaveDir.open(str(tmp_path / "out") + "/") as save:
        save.write_json("new.json", [])
    assert sorted(os.listdir(tmp_path / "out")) == ["new.json", "old.json"]
    assert mode(tmp_path / "out") == 0o755


@pytest.mark.parametrize("bits, who", [(0o775, "its group"), (0o757, "others"),
                                       (0o777, "its group and others"), (0o1777, "its group and others")])
def test_a_directory_others_can_write_is_refused(tmp_path, bits, who):
    (tmp_path / "out").mkdir()
    os.chmod(tmp_path / "out", bits)
    refused(tmp_path / "out", f"writable by {who} (mode {bits:04o}); make it private (chmod go-w) "
                              "or name another directory")
    assert os.listdir(tmp_path / "out") == []


def test_a_directory_of_another_user_is_refused(tmp_path):
    if ROOT:
        (tmp_path / "out").mkdir(mode=0o700)
        os.chown(tmp_path / "out", 65534, 65534)
        path, owner, me = tmp_path / "out", "nobody (uid 65534)", "root (uid 0)"
    else:   # a non-root run: / is root's
        import pwd
        path, owner = "/", "root (uid 0)"
        me = f"{pwd.getpwuid(os.geteuid()).pw_name} (uid {os.geteuid()})"
    refused(path, f"owned by {owner}, not by you ({me}); name a directory of your own")


def test_a_symbolic_link_as_the_directory_is_refused_and_never_followed(tmp_path):
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "out").symlink_to(tmp_path / "real")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    refused(tmp_path / "out", "a symbolic link; name the directory itself")
    refused(tmp_path / "dangling", "a symbolic link; name the directory itself")
    assert os.listdir(tmp_path / "real") == [] and not (tmp_path / "nowhere").exists()


def test_a_file_or_a_path_through_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("keep")
    refused(tmp_path / "file", "not a directory")
    refused(tmp_path / "file" / "sub", "not a directory")
    assert (tmp_path / "file").read_text() == "keep"


@pytest.mark.skipif(ROOT, reason="root writes through a read-only mode; see the read-only mount case")
def test_a_directory_we_cannot_write_is_refused(tmp_path):
    (tmp_path / "out").mkdir(mode=0o500)
    refused(tmp_path / "out", "Permission denied")


def test_a_read_only_mount_is_refused_before_anything_runs(tmp_path):
    """A read-only bind mount (root only: mount(2)); the write probe finds it up front."""
    if not ROOT:
        pytest.skip("needs root to mount")
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o700)
    subprocess.run(["mount", "--bind", "-o", "ro", str(ro), str(ro)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], check=True)
        refused(ro, "Read-only file system")
    finally:
        subprocess.run(["umount", "--lazy", str(ro)], check=True)   # lazy: even with an fd left open


def test_a_link_planted_under_a_final_name_is_replaced_never_followed(tmp_path, victim):
    (tmp_path / "out").mkdir(mode=0o700)
    for name in ("a.json", "report.md"):
        (tmp_path / "out" / name).symlink_to(victim)
    with SaveDir.open(str(tmp_path / "out")) as save:
        save.check_files(["a.json", "report.md"])
        save.write_json("a.json", {"status": "ok"})
        save.write_text("report.md", lambda f: f.write("* * * * * root evil\n"))
    assert victim.read_text() == "original\n"
    assert not (tmp_path / "out" / "a.json").is_symlink()
    assert json.loads((tmp_path / "out" / "a.json").read_text()) == {"status": "ok"}
    assert (tmp_path / "out" / "report.md").read_text() == "* * * * * root evil\n"


def test_links_planted_under_temp_names_are_never_opened(tmp_path, victim):
    out = tmp_path / "out"
    out.mkdir(mode=0o700)
    for name in ("a.json.part", "summary.json.part", ".a.json.part", "report.md.part"):
        (out / name).symlink_to(victim)
    with SaveDir.open(str(out)) as save:
        save.write_json("a.json", {})
        save.write_json("summary.json", {})
    assert victim.read_text() == "original\n"
    assert sorted(os.listdir(out)) == sorted(["a.json", "summary.json", "a.json.part",
                                              "summary.json.part", ".a.json.part", "report.md.part"])


def test_writes_follow_the_open_directory_not_its_path(tmp_path, victim):
    """DIR renamed away and its path replaced by a link after the check: writes still go to
    the directory that was checked (its fd), never through the link."""
    out = tmp_path / "out"
    with SaveDir.open(str(out)) as save:
        out.rename(tmp_path / "moved")
        out.symlink_to(victim.parent)
        save.write_json("a.json", {"x": 1})
        sub = save.subdir("steps")
        sub.write_json("b.json", {})
        sub.close()
    assert sorted(os.listdir(victim.parent)) == ["crontab"]
    assert sorted(os.listdir(tmp_path / "moved")) == ["a.json", "steps"]
    assert os.listdir(tmp_path / "moved" / "steps") == ["b.json"]


def test_subdirectories_are_made_private_and_checked_like_the_directory(tmp_path, victim):
    out = tmp_path / "out"
    with SaveDir.open(str(out)) as save:
        with save.subdir("steps") as steps:
            with steps.subdir("01-ping") as step:
                step.write_json("local.json", {})
        assert mode(out / "steps") == 0o700 and mode(out / "steps" / "01-ping") == 0o700
        (out / "linked").symlink_to(victim.parent)
        with pytest.raises(InputError) as exc:
            save.subdir("linked")
        assert str(exc.value) == f"--save {out}/linked: a symbolic link; name the directory itself"
        (out / "shared").mkdir()
        os.chmod(out / "shared", 0o777)
        with pytest.raises(InputError, match="shared: writable by its group and others"):
            save.subdir("shared")
        for bad in ("", ".", "..", "a/b"):
            with pytest.raises(ValueError):
                save.subdir(bad)
    assert sorted(os.listdir(victim.parent)) == ["crontab"]


def test_a_directory_in_the_way_of_a_file_is_found_before_the_run(tmp_path):
    out = tmp_path / "out"
    (out / "report.md").mkdir(parents=True)
    os.chmod(out, 0o700)
    with SaveDir.open(str(out)) as save:
        save.check_files(["summary.json", "a.json"])   # absent: fine
        with pytest.raises(InputError) as exc:
            save.check_files(["report.json", "report.md"])
    assert str(exc.value) == f"--save {out}/report.md: a directory is in the way of a file mldiag writes"


def test_a_failed_write_leaves_the_old_file_and_no_temp(tmp_path):
    out = tmp_path / "out"
    with SaveDir.open(str(out)) as save:
        save.write_text("r.md", lambda f: f.write("old"))

        def broken(f):
            f.write("half")
            raise KeyboardInterrupt
        with pytest.raises(KeyboardInterrupt):
            save.write_text("r.md", broken)
    assert os.listdir(out) == ["r.md"] and (out / "r.md").read_text() == "old"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_as_the_temp_file_is_made_leaves_no_part_file(tmp_path, monkeypatch, sig):
    """The signal arrives right after the temp file exists, before write_text knows its name
    (issue 29 §4): it waits until the file is whole and renamed, then ends the run as usual;
    no ``.part`` file is left and the file read back is the new one, complete."""
    made = SaveDir._new_temp

    def then_a_signal(self, name):
        temp = made(self, name)
        os.kill(os.getpid(), sig)
        signal.pthread_sigmask(signal.SIG_BLOCK, [])     # a bytecode boundary for the handler
        return temp
    out = tmp_path / "out"
    with SaveDir.open(str(out)) as save:
        save.write_json("r.json", {"old": True})
        monkeypatch.setattr(SaveDir, "_new_temp", then_a_signal)
        with pytest.raises(KeyboardInterrupt) as caught:
            with termination.terminates_like_ctrl_c():
                save.write_json("r.json", {"new": list(range(1000))})
    assert termination.exit_code_of(caught.value) == 128 + sig
    assert os.listdir(out) == ["r.json"]
    assert json.loads((out / "r.json").read_text()) == {"new": list(range(1000))}


def test_result_file_names():
    assert result_file_name("cluster-a:n3") == "cluster-a_n3.json"
    assert result_file_name("../../etc/cron.d/x") == ".._.._etc_cron.d_x.json"
    assert result_file_name("") == "target.json"


# --------------------------------------------------------------------------- through `mldiag`

@pytest.fixture
def marked_local(tmp_path):
    """hosts.yaml with a local target whose interpreter leaves a mark when it is started."""
    python, mark = marking_python(tmp_path)
    (tmp_path / "hosts.yaml").write_text(f"hosts:\n  box: {{local: true, python: {python}}}\n")
    return mark


@pytest.mark.parametrize("case", ["file", "through-a-file", "others-can-write", "link", "dir-in-the-way"])
def test_a_refused_save_is_exit_4_before_any_target_runs(tmp_path, marked_local, case):
    save = tmp_path / "save"
    expected = {"file": "not a directory", "through-a-file": "not a directory",
                "others-can-write": "writable by its group and others (mode 0777); make it private "
                                    "(chmod go-w) or name another directory",
                "link": "a symbolic link; name the directory itself",
                "dir-in-the-way": "a directory is in the way of a file mldiag writes"}[case]
    if case == "file":
        save.write_text("keep")
    elif case == "through-a-file":
        (tmp_path / "f").write_text("keep")
        save = tmp_path / "f" / "save"
    elif case == "others-can-write":
        save.mkdir()
        os.chmod(save, 0o777)
    elif case == "link":
        (tmp_path / "real").mkdir()
        save.symlink_to(tmp_path / "real")
    else:
        (save / "box.json").mkdir(parents=True)
        os.chmod(save, 0o700)
    r = mldiag("ping", "-H", "box", "--save", str(save), cwd=tmp_path, timeout=60)
    shown = f"{save}/box.json" if case == "dir-in-the-way" else str(save)
    assert (r.returncode, r.stdout, r.stderr) == (4, "", f"mldiag: --save {shown}: {expected}\n")
    assert not marked_local.exists()


def test_a_runbook_refuses_a_planted_steps_link_before_any_target_runs(tmp_path, marked_local, victim):
    save = tmp_path / "save"
    save.mkdir(mode=0o700)
    (save / "steps").symlink_to(victim.parent)
    r = mldiag("runbook", "node-health", "-H", "box", "--save", str(save), cwd=tmp_path, timeout=60)
    assert (r.returncode, r.stdout) == (4, "")
    assert r.stderr == f"mldiag: --save {save}/steps: a symbolic link; name the directory itself\n"
    assert not marked_local.exists() and sorted(os.listdir(victim.parent)) == ["crontab"]


def test_a_save_run_writes_through_planted_links_without_following_them(tmp_path, marked_local, victim):
    save = tmp_path / "save"
    save.mkdir(mode=0o700)
    for name in ("box.json", "box.json.part", "summary.json", "summary.json.part"):
        (save / name).symlink_to(victim)
    r = mldiag("ping", "-H", "box", "--save", str(save), cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    assert marked_local.exists() and victim.read_text() == "original\n"
    assert json.loads((save / "box.json").read_text())["status"] == "ok"
    assert json.loads((save / "summary.json").read_text())["targets"] == {"box": "ok"}
    assert sorted(os.listdir(save)) == ["box.json", "box.json.part", "summary.json", "summary.json.part"]
