"""Attacks on the kept ``ssh -G`` answers (diagnostics/transport/sshg_cache.py; issue 29 section 4):
a planted or edited answer is never believed, and a disbelieved one costs one ``ssh -G``, never
a connection to another host; a config that runs a command is never kept, however its ``Match``
line is spelled; and the files watched are the ones ssh reads (its home directory is the
password database's, not ``$HOME``). The ssh here is the real OpenSSH client, behind the
counting wrapper of test_sshg_cache.py."""

import json
import os
import pwd
import shutil
import uuid
from pathlib import Path

import pytest

from diagnostics.transport import sshconfig, sshg_cache
from tests.unit.test_sshg_cache import needs_ssh, new_process, write_config

GOOD = "10.1.2.3"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


def kept_file(monkeypatch) -> Path:
    """The one file of kept answers in the private directory (after a flush)."""
    sshg_cache.flush()
    found = list(Path(os.environ["XDG_RUNTIME_DIR"], "mldiag").glob("sshg-*.json"))
    assert len(found) == 1, found
    return found[0]


def asked_once_more(monkeypatch, counted_ssh, before: int) -> None:  # noqa: F811
    """A new process gets the config's own answer at the cost of one ``ssh -G``; the one after
    it is served from the rewritten file."""
    new_process(monkeypatch)
    assert sshconfig.ssh_dash_g("box")["hostname"] == [GOOD]
    assert counted_ssh() == before + 1
    sshg_cache.flush()
    new_process(monkeypatch)
    assert sshconfig.ssh_dash_g("box")["hostname"] == [GOOD]
    assert counted_ssh() == before + 1


@pytest.fixture
def kept(tmp_path, monkeypatch, counted_ssh):  # noqa: F811
    """A config whose answer for ``box`` has been kept: (the kept file, its document)."""
    monkeypatch.setenv("MLDIAG_SSH_CONFIG", str(write_config(tmp_path / "cfg", GOOD)))
    assert sshconfig.ssh_dash_g("box")["hostname"] == [GOOD]
    path = kept_file(monkeypatch)
    return path, json.loads(path.read_text())


def evil(answer: str) -> str:
    """The answer with another host and a ProxyCommand that would run a command here."""
    lines = [line for line in answer.splitlines() if not line.startswith(("hostname ", "proxycommand "))]
    return "\n".join(lines + ["hostname 10.66.6.6", "proxycommand nc 10.66.6.6 22"]) + "\n"


@needs_ssh
def test_an_edited_hostname_or_proxycommand_is_not_believed(kept, monkeypatch, counted_ssh):  # noqa: F811
    path, doc = kept
    doc["answers"] = {key: evil(answer) for key, answer in doc["answers"].items()}
    path.write_text(json.dumps(doc))            # the owner's file, 0600, in its place
    asked_once_more(monkeypatch, counted_ssh, 1)


@needs_ssh
@pytest.mark.parametrize("mode", [0o666, 0o620, 0o602])
def test_a_kept_file_others_may_write_is_not_believed(kept, monkeypatch, counted_ssh, mode):  # noqa: F811
    path, _ = kept
    path.chmod(mode)
    asked_once_more(monkeypatch, counted_ssh, 1)


@needs_ssh
def test_a_file_renamed_from_another_states_name_is_not_believed(tmp_path, monkeypatch,
                                                                counted_ssh):  # noqa: F811
    """The answers of an earlier config (HostName elsewhere), renamed to the current state's
    name: whole, well formed and the user's own, but not this state's."""
    config = tmp_path / "cfg"
    monkeypatch.setenv("MLDIAG_SSH_CONFIG", str(config))
    write_config(config, "10.66.6.6")
    sshconfig.ssh_dash_g("box")
    old = kept_file(monkeypatch)
    write_config(config, GOOD)
    current = old.with_name(f"sshg-{sshg_cache.state_digest(shutil.which('ssh'), str(config))}.json")
    old.rename(current)
    asked_once_more(monkeypatch, counted_ssh, 1)


@needs_ssh
@needs_root
def test_a_planted_file_of_another_user_is_not_believed(kept, monkeypatch, counted_ssh):  # noqa: F811
    path, doc = kept
    doc["answers"] = {key: evil(answer) for key, answer in doc["answers"].items()}
    doc["sum"] = sshg_cache._checksum(doc["answers"])     # as mldiag itself would write it
    path.unlink()
    path.write_text(json.dumps(doc))
    os.chown(path, 65534, 65534)
    asked_once_more(monkeypatch, counted_ssh, 1)


@pytest.mark.parametrize("answer", ["", "user ml\n", "hostname\n", "host box\nhostname a\n\n",
                                    "hostname a\nproxy-command x\n"])
def test_an_answer_not_in_the_form_of_ssh_dash_g_output_is_dropped(tmp_path, answer):
    d = tmp_path / "private"
    d.mkdir(mode=0o700)
    store = sshg_cache.AnswerFile(str(d), "abc")
    store.answers.update(k=answer, good="host box\ncanonicalizePermittedcnames none\nhostname a\n")
    store.save()
    assert list(sshg_cache.AnswerFile(str(d), "abc").answers) == ["good"]


# ------------------------------------------------------------------ configs that run a command

MATCH_SPELLINGS = ["Match exec={mark}", 'Match exec="{mark}"', "Match  Exec {mark}",
                   "Match\texec\t{mark}", "Match=exec {mark}", "MATCH EXEC={mark}",
                   "Match originalhost box exec={mark}", "Match !exec={mark}"]


@needs_ssh
@pytest.mark.parametrize("spelling", MATCH_SPELLINGS)
@pytest.mark.parametrize("where", ["config", "included"])
def test_a_match_exec_in_any_spelling_is_asked_every_time(tmp_path, monkeypatch, counted_ssh,  # noqa: F811
                                                          spelling, where):
    """ssh runs the command for each spelling (the mark file shows it): its answers are never
    kept, in the config itself or in a file it Includes."""
    ran = tmp_path / "ran"
    mark = tmp_path / "mark.sh"
    mark.write_text(f"#!/bin/sh\necho ran >> {ran}\n")
    mark.chmod(0o755)
    line = spelling.format(mark=mark) + "\n  User viaexec\n"
    config = tmp_path / "cfg"
    if where == "included":
        (tmp_path / "inc.conf").write_text(line)
        config.write_text(f"Host box\n  HostName {GOOD}\nInclude {tmp_path}/inc.conf\n")
    else:
        write_config(config, GOOD, line)
    monkeypatch.setenv("MLDIAG_SSH_CONFIG", str(config))
    for _ in range(2):
        new_process(monkeypatch)
        sshconfig.ssh_dash_g("box")
        sshg_cache.flush()
    assert counted_ssh() == 2
    assert ran.read_text() == "ran\n" * 2
    assert not list(Path(os.environ["XDG_RUNTIME_DIR"], "mldiag").glob("sshg-*"))


def test_match_criteria_are_split_at_equals_as_ssh_splits_them():
    assert sshg_cache._match_criteria(["Match", "!Exec=x", "host=a"]) == ["exec", "x", "host", "a"]


# ------------------------------------------------------------------ the home directory ssh reads

def test_tilde_is_the_password_databases_home_not_dollar_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "not-home"))
    home = pwd.getpwuid(os.getuid()).pw_dir
    assert sshg_cache.home_dir() == home
    config = tmp_path / "cfg"
    config.write_text("Include ~/mldiag-no-such.conf\n")
    closure = sshg_cache.config_closure([(str(config), str(tmp_path))])
    assert closure[1][:2] == ["glob", f"{home}/mldiag-no-such.conf"]


@pytest.fixture
def real_user_config():
    """``~/.ssh/config`` of the password database's home directory, which is the one ssh
    reads: made for the test (a Host block for an alias of its own) and removed after. Only
    where it does not exist already: a user's own config is never touched."""
    home = pwd.getpwuid(os.getuid()).pw_dir
    ssh_dir = Path(home, ".ssh")
    config = ssh_dir / "config"
    if config.exists() or config.is_symlink():
        pytest.skip(f"{config} exists: the test does not edit a real config")
    made_dir = not ssh_dir.exists()
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    try:
        yield config
    finally:
        config.unlink(missing_ok=True)
        if made_dir:
            try:
                ssh_dir.rmdir()
            except OSError:
                pass        # something else wrote there meanwhile: left as it is


@needs_ssh
def test_an_edit_to_the_config_ssh_really_reads_is_asked_again_when_home_differs(
        tmp_path, monkeypatch, counted_ssh, real_user_config):  # noqa: F811
    """As under ``sudo`` with HOME kept: $HOME names another directory, whose config ssh does
    not read. An edit to the config it does read changes the kept answer."""
    alias = f"mldiag-home-{uuid.uuid4().hex[:8]}"
    fake_home = tmp_path / "kept-home"
    (fake_home / ".ssh").mkdir(parents=True)
    (fake_home / ".ssh" / "config").write_text(f"Host {alias}\n  HostName 10.66.6.6\n")
    monkeypatch.setenv("HOME", str(fake_home))
    monkeypatch.delenv("MLDIAG_SSH_CONFIG", raising=False)
    real_user_config.write_text(f"Host {alias}\n  HostName 10.1.1.1\n")
    real_user_config.chmod(0o600)
    assert sshconfig.ssh_dash_g(alias)["hostname"] == ["10.1.1.1"]     # ssh reads the real one
    sshg_cache.flush()
    real_user_config.write_text(f"Host {alias}\n  HostName 10.2.2.2\n")
    new_process(monkeypatch)
    assert sshconfig.ssh_dash_g(alias)["hostname"] == ["10.2.2.2"]
    assert counted_ssh() == 2
