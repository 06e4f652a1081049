"""``ssh -G`` answers kept between runs (diagnostics/transport/sshg_cache.py): asked again whenever
anything they depend on changes, never kept for a config that asks a command or the network,
and kept only in the user's private directory. The ssh here is the real OpenSSH client, behind a
wrapper on PATH that counts its calls."""

import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from diagnostics.transport import sshconfig, sshg_cache
from diagnostics.transport.sshg_cache import NotKept, config_closure, state_digest

REAL_SSH = shutil.which("ssh")
needs_ssh = pytest.mark.skipif(REAL_SSH is None and os.environ.get("CI") != "true",
                               reason="no OpenSSH client here")


def new_process(monkeypatch):
    """What a new mldiag process starts with: no answers in memory."""
    monkeypatch.setattr(sshconfig, "_cache", {})
    monkeypatch.setattr(sshg_cache, "_files", {})


def write_config(path: Path, hostname: str, extra: str = "") -> Path:
    path.write_text(f"Host box\n  HostName {hostname}\n  Port 2222\n  User ml\n{extra}")
    return path


@needs_ssh
def test_a_second_process_gets_the_kept_answer_without_running_ssh(tmp_path, monkeypatch, counted_ssh):
    config = write_config(tmp_path / "cfg", "10.1.2.3")
    monkeypatch.setenv("MLDIAG_SSH_CONFIG", str(config))
    first = sshconfig.ssh_dash_g("box")
    sshg_cache.flush()
    assert counted_ssh() == 1 and first["hostname"] == ["10.1.2.3"] and first["port"] == ["2222"]
    new_process(monkeypatch)
    assert sshconfig.ssh_dash_g("box") == first
    assert counted_ssh() == 1
    # another alias, port or user is another question
    sshconfig.ssh_dash_g("box", port=2200)
    sshconfig.ssh_dash_g("box", user="other")
    assert counted_ssh() == 3
    kept = [p for p in Path(os.environ["XDG_RUNTIME_DIR"], "mldiag").iterdir()]
    assert len(kept) == 1 and stat.S_IMODE(kept[0].stat().st_mode) == 0o600


@needs_ssh
def test_a_changed_config_is_asked_again_even_with_the_same_size_and_mtime(tmp_path, monkeypatch,
                                                                          counted_ssh):
    config = write_config(tmp_path / "cfg", "10.1.2.3")
    monkeypatch.setenv("MLDIAG_SSH_CONFIG", str(config))
    before = config.stat()
    assert sshconfig.ssh_dash_g("box")["hostname"] == ["10.1.2.3"]
    sshg_cache.flush()
    write_config(config, "10.9.8.7")              # same length
    os.utime(config, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert config.stat().st_size == before.st_size and config.stat().st_mtime_ns == before.st_mtime_ns
    new_process(monkeypatch)
    assert sshconfig.ssh_dash_g("box")["hostname"] == ["10.9.8.7"]
    assert counted_ssh() == 2


@needs_ssh
def test_a_new_file_under_an_include_glob_is_asked_again(tmp_path, monkeypatch, counted_ssh):
    confd = tmp_path / "conf.d"
    confd.mkdir()
    config = tmp_path / "cfg"
    config.write_text(f"Include {confd}/*.conf\nHost box\n  HostName 10.1.2.3\n")
    monkeypatch.setenv("MLDIAG_SSH_CONFIG", str(config))
    assert sshconfig.ssh_dash_g("box")["hostname"] == ["10.1.2.3"]
    sshg_cache.flush()
    (confd / "early.conf").write_text("Host box\n  HostName 10.4.4.4\n")   # read first: it wins
    new_process(monkeypatch)
    assert sshconfig.ssh_dash_g("box")["hostname"] == ["10.4.4.4"]
    assert counted_ssh() == 2


@needs_ssh
@pytest.mark.parametrize("extra", ['Match exec "true"\n  User viaexec\n',
                                   'Match !exec "false"\n  User negated\n',
                                   "Match canonical all\n  User c\n",
                                   "CanonicalizeHostname yes\n"])
def test_a_config_that_asks_a_command_or_the_network_is_asked_every_time(tmp_path, monkeypatch,
                                                                      counted_ssh, extra):
    config = write_config(tmp_path / "cfg", "10.1.2.3", extra)
    monkeypatch.setenv("MLDIAG_SSH_CONFIG", str(config))
    first = sshconfig.ssh_dash_g("box")
    sshg_cache.flush()
    new_process(monkeypatch)
    assert sshconfig.ssh_dash_g("box") == first
    assert counted_ssh() == 2
    assert not list(Path(os.environ["XDG_RUNTIME_DIR"], "mldiag").glob("sshg-*"))


@needs_ssh
def test_turned_off_it_asks_every_time(tmp_path, monkeypatch, counted_ssh):
    monkeypatch.setenv("MLDIAG_SSH_CONFIG", str(write_config(tmp_path / "cfg", "10.1.2.3")))
    monkeypatch.setenv(sshg_cache.ENV_SWITCH, "0")
    sshconfig.ssh_dash_g("box")
    sshg_cache.flush()
    new_process(monkeypatch)
    sshconfig.ssh_dash_g("box")
    assert counted_ssh() == 2


@needs_ssh
def test_a_failed_ssh_dash_g_is_not_kept(tmp_path, monkeypatch, counted_ssh):
    config = tmp_path / "cfg"
    config.write_text("Host box\n  NoSuchOption yes\n")
    monkeypatch.setenv("MLDIAG_SSH_CONFIG", str(config))
    for _ in range(2):
        new_process(monkeypatch)
        with pytest.raises(Exception, match="ssh -G box failed"):
            sshconfig.ssh_dash_g("box")
        sshg_cache.flush()
    assert counted_ssh() == 2


def test_the_closure_follows_includes_relative_quoted_and_keyword_equals(tmp_path):
    home_ssh = tmp_path / "dotssh"
    (home_ssh / "d").mkdir(parents=True)
    (home_ssh / "d" / "b.conf").write_text("Include=inner.conf\n")
    (home_ssh / "inner.conf").write_text("Host x\n  User y\n")
    (home_ssh / "with space.conf").write_text("# only a comment\n")
    top = home_ssh / "config"
    top.write_text('Host *\n  Include d/*.conf "with space.conf" missing.conf\n')
    closure = config_closure([(str(top), str(home_ssh))])
    paths = [entry[0] if entry[0] != "glob" else ("glob", entry[1]) for entry in closure]
    assert paths == [str(top), ("glob", f"{home_ssh}/d/*.conf"), f"{home_ssh}/d/b.conf",
                     ("glob", f"{home_ssh}/inner.conf"), f"{home_ssh}/inner.conf",
                     ("glob", f"{home_ssh}/with space.conf"), f"{home_ssh}/with space.conf",
                     ("glob", f"{home_ssh}/missing.conf")]
    assert closure[-1][2] == []                   # nothing matched: recorded as such


def test_the_closure_refuses_what_no_file_pins_down(tmp_path):
    loop = tmp_path / "loop.conf"
    loop.write_text(f"Include {loop}\n")
    with pytest.raises(NotKept):
        config_closure([(str(loop), str(tmp_path))])      # past OpenSSH's Include depth
    for text in ('Match host a exec "x"', "Match final", "match !Exec x", "CanonicalizeHostname always",
                 "Match localnetwork 10.0.0.0/8"):   # OpenSSH 9.4+
        config = tmp_path / "c.conf"
        config.write_text(text + "\n")
        with pytest.raises(NotKept):
            config_closure([(str(config), str(tmp_path))])
    config.write_text("CanonicalizeHostname no\nMatch host exec-box\n  User a\n")
    assert config_closure([(str(config), str(tmp_path))])  # a host named "exec-box" is fine


def test_the_digest_follows_referenced_variables_and_modes_only(tmp_path, monkeypatch):
    ssh = REAL_SSH or "/bin/sh"
    config = tmp_path / "cfg"
    config.write_text("Host box\n  IdentityFile ${KEYS}/id\n")
    env = {"KEYS": "/k1", "USER": "ml", "UNRELATED": "a"}
    first = state_digest(ssh, str(config), env)
    assert state_digest(ssh, str(config), dict(env, UNRELATED="b")) == first
    assert state_digest(ssh, str(config), dict(env, KEYS="/k2")) != first
    config.chmod(0o666)
    assert state_digest(ssh, str(config), env) != first


def private_store(tmp_path) -> Path:
    d = tmp_path / "private"
    d.mkdir(mode=0o700)
    return d


def test_a_planted_link_is_neither_read_nor_written_through(tmp_path):
    d = private_store(tmp_path)
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps({"format": sshg_cache.FORMAT, "answers": {"k": "hostname evil\n"}}))
    store_name = d / "sshg-abc.json"
    store_name.symlink_to(elsewhere)
    store = sshg_cache.AnswerFile(str(d), "abc")
    assert store.answers == {}                                 # not read through the link
    store.answers["k"] = "hostname good\n"
    store.save()
    assert json.loads(elsewhere.read_text())["answers"] == {"k": "hostname evil\n"}   # untouched
    assert not store_name.is_symlink()
    assert sshg_cache.AnswerFile(str(d), "abc").answers == {"k": "hostname good\n"}


@pytest.mark.parametrize("content", [b"{not json", b'{"format": 1, "answers": [1, 2]}',
                                     b'{"format": 99, "answers": {"k": "v"}}', b'{"format": 1, "answers": {"k": 3}}'])
def test_a_damaged_file_is_ignored(tmp_path, content):
    d = private_store(tmp_path)
    (d / "sshg-abc.json").write_bytes(content)
    assert sshg_cache.AnswerFile(str(d), "abc").answers == {}


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
@pytest.mark.parametrize("foreign", ["file", "directory"])
def test_a_file_or_directory_of_another_user_is_ignored(tmp_path, foreign):
    """A file as mldiag wrote it, then given to another user; or the user's own file in a
    directory someone else owns (one swapped in after ``private_dir`` checked it)."""
    d = private_store(tmp_path)
    f = d / "sshg-abc.json"
    store = sshg_cache.AnswerFile(str(d), "abc")
    store.answers["k"] = "hostname good\n"
    store.save()
    assert sshg_cache.AnswerFile(str(d), "abc").answers == {"k": "hostname good\n"}
    os.chown(f if foreign == "file" else d, 65534, 65534)
    assert sshg_cache.AnswerFile(str(d), "abc").answers == {}


def test_only_the_most_recent_states_are_kept(tmp_path):
    d = private_store(tmp_path)
    for i in range(sshg_cache.KEEP_STATES + 3):
        store = sshg_cache.AnswerFile(str(d), f"state{i:02d}")
        store.answers["k"] = "v"
        store.save()
        os.utime(d / store.name, ns=(i * 10**9, i * 10**9))
    names = sorted(p.name for p in d.iterdir())
    assert len(names) == sshg_cache.KEEP_STATES
    assert f"sshg-state{sshg_cache.KEEP_STATES + 2:02d}.json" in names and "sshg-state00.json" not in names


@needs_ssh
def test_a_batch_reads_the_state_once_and_writes_its_answers_at_the_end(tmp_path, monkeypatch,
                                                                       counted_ssh):
    config = write_config(tmp_path / "cfg", "10.1.2.3", "Host other\n  HostName 10.5.5.5\n")
    monkeypatch.setenv("MLDIAG_SSH_CONFIG", str(config))
    reads = []
    real = sshg_cache.state_digest
    monkeypatch.setattr(sshg_cache, "state_digest", lambda *a: reads.append(a) or real(*a))
    with sshg_cache.batch():
        sshconfig.ssh_dash_g("box")
        sshconfig.ssh_dash_g("other")
        assert not list(Path(os.environ["XDG_RUNTIME_DIR"], "mldiag").glob("sshg-*"))   # not yet
    assert len(reads) == 1 and len(list(Path(os.environ["XDG_RUNTIME_DIR"], "mldiag").glob("sshg-*"))) == 1
    write_config(config, "10.7.7.7")            # after the batch: the state is read again
    new_process(monkeypatch)
    assert sshconfig.ssh_dash_g("box")["hostname"] == ["10.7.7.7"]
    assert len(reads) == 2 and counted_ssh() == 3
