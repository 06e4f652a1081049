"""The target's code cache (diagnostics/scripts/_stage_a.py, issue 14 goals 1-2): mldiag's own
code kept compiled per user and Python, used only from a directory and files of the user's
own, never through a link, never a user's script; and the runs through it answer as before.

The cache directory here is $XDG_CACHE_HOME/mldiag/code with XDG_CACHE_HOME a test directory
(local targets inherit this process's environment); tests/integration/test_code_cache.py has
a lab user's ~/.cache over SSH."""

import hashlib
import marshal
import os
import stat
import sys

import pytest

from diagnostics.engine import bundle, runner
from diagnostics.core import wire
from diagnostics.transport.ssh import SshPool
from diagnostics.inventory.topology import Target
from tests.programs import load_script, space_free_python

stage_a = load_script("_stage_a.py", "mldiag_stage_a_under_test")

SOURCE = b"def nested():\n    def inner():\n        return 'first'\n    return inner()\nVALUE = nested()\n"


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    home = tmp_path / "xdg"
    home.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    return home


def entries(home):
    d = home / "mldiag" / "code"
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


def run_code(code) -> dict:
    space = {}
    exec(code, space)
    return space


def test_our_code_is_kept_and_used_again(cache_home):
    code = stage_a.load_code(SOURCE, "/tmp/run1/script.py", digest(SOURCE))
    assert run_code(code)["VALUE"] == "first"
    [name] = entries(cache_home)
    assert name.startswith(digest(SOURCE) + "-") and name.endswith(f"-o{sys.flags.optimize}")
    directory = cache_home / "mldiag" / "code"
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE((cache_home / "mldiag").stat().st_mode) == 0o700
    assert stat.S_IMODE((directory / name).stat().st_mode) == 0o600
    # the same digest names the kept code: a changed source is not even read (proof the cache
    # answered), and the code carries this run's file name, nested functions too
    again = stage_a.load_code(SOURCE.replace(b"first", b"second"), "/tmp/run2/script.py", digest(SOURCE))
    assert run_code(again)["VALUE"] == "first"
    assert again.co_filename == "/tmp/run2/script.py"
    nested = [c for c in again.co_consts if isinstance(c, type(again))]
    assert nested and all(c.co_filename == "/tmp/run2/script.py" for c in nested)
    inner = [c for c in nested[0].co_consts if isinstance(c, type(again))]
    assert inner[0].co_filename == "/tmp/run2/script.py"
    assert entries(cache_home) == [name]


@pytest.mark.parametrize("given", ["", "abc", "g" * 64, digest(SOURCE).upper(), "../" + "a" * 61])
def test_without_a_proper_digest_nothing_is_kept(cache_home, given):
    assert run_code(stage_a.load_code(SOURCE, "s.py", given))["VALUE"] == "first"
    assert entries(cache_home) == []


def test_a_planted_link_for_the_directory_is_not_followed(cache_home, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (cache_home / "mldiag").mkdir(mode=0o700)
    (cache_home / "mldiag" / "code").symlink_to(elsewhere)
    assert run_code(stage_a.load_code(SOURCE, "s.py", digest(SOURCE)))["VALUE"] == "first"
    assert list(elsewhere.iterdir()) == []


def test_a_planted_link_for_an_entry_is_not_read(cache_home, tmp_path):
    stage_a.load_code(SOURCE, "s.py", digest(SOURCE))
    [name] = entries(cache_home)
    entry = cache_home / "mldiag" / "code" / name
    evil = tmp_path / "evil"
    evil.write_bytes(marshal.dumps(compile("VALUE = 'planted'", "evil", "exec")))
    entry.unlink()
    entry.symlink_to(evil)
    assert run_code(stage_a.load_code(SOURCE, "s.py", digest(SOURCE)))["VALUE"] == "first"


def test_a_directory_others_may_write_is_not_used(cache_home):
    stage_a.load_code(SOURCE, "s.py", digest(SOURCE))
    [name] = entries(cache_home)
    directory = cache_home / "mldiag" / "code"
    (directory / name).write_bytes(marshal.dumps(compile("VALUE = 'planted'", "evil", "exec")))
    directory.chmod(0o777)
    assert run_code(stage_a.load_code(SOURCE, "s.py", digest(SOURCE)))["VALUE"] == "first"
    directory.chmod(0o700)      # ours again: the planted entry is what it reads now
    assert run_code(stage_a.load_code(SOURCE, "s.py", digest(SOURCE)))["VALUE"] == "planted"


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
@pytest.mark.parametrize("whose", ["xdg", "directory", "entry"])
def test_what_another_user_owns_is_never_used(cache_home, whose):
    stage_a.load_code(SOURCE, "s.py", digest(SOURCE))
    [name] = entries(cache_home)
    directory = cache_home / "mldiag" / "code"
    (directory / name).write_bytes(marshal.dumps(compile("VALUE = 'planted'", "evil", "exec")))
    path = {"xdg": cache_home, "directory": directory, "entry": directory / name}[whose]
    os.chown(path, 65534, 65534)
    assert run_code(stage_a.load_code(SOURCE, "s.py", digest(SOURCE)))["VALUE"] == "first"
    if whose == "xdg":   # someone else's XDG_CACHE_HOME: not even written into
        os.chown(directory / name, 0, 0)
        (directory / name).unlink()
        stage_a.load_code(SOURCE, "s.py", digest(SOURCE))
        assert entries(cache_home) == []


@pytest.mark.parametrize("damage", [b"", b"\x00garbage", b"truncated" * 3, "not code"])
def test_a_damaged_entry_is_compiled_again_and_replaced(cache_home, damage):
    stage_a.load_code(SOURCE, "s.py", digest(SOURCE))
    [name] = entries(cache_home)
    entry = cache_home / "mldiag" / "code" / name
    entry.write_bytes(marshal.dumps(damage) if isinstance(damage, str) else damage)
    assert run_code(stage_a.load_code(SOURCE, "s.py", digest(SOURCE)))["VALUE"] == "first"
    assert isinstance(marshal.loads(entry.read_bytes()), type(compile("", "", "exec")))


def test_an_oversized_entry_is_not_read(cache_home):
    stage_a.load_code(SOURCE, "s.py", digest(SOURCE))
    [name] = entries(cache_home)
    entry = cache_home / "mldiag" / "code" / name
    with open(entry, "r+b") as f:
        f.truncate(stage_a.MAX_CODE_BYTES + 1)
    assert run_code(stage_a.load_code(SOURCE, "s.py", digest(SOURCE)))["VALUE"] == "first"


def test_the_cache_keeps_a_bounded_number_of_entries(cache_home):
    directory = cache_home / "mldiag" / "code"
    directory.mkdir(parents=True, mode=0o700)
    for i in range(stage_a.MAX_ENTRIES + 6):
        old = directory / f"old{i:03d}"
        old.write_bytes(b"x")
        os.utime(old, (1000 + i, 1000 + i))
    stage_a.load_code(SOURCE, "s.py", digest(SOURCE))
    kept = entries(cache_home)
    assert len(kept) == stage_a.MAX_ENTRIES
    assert any(n.startswith(digest(SOURCE)) for n in kept)
    assert "old000" not in kept and f"old{stage_a.MAX_ENTRIES + 5:03d}" in kept


def test_an_unwritable_cache_still_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "missing" / "deeper"))
    assert run_code(stage_a.load_code(SOURCE, "s.py", digest(SOURCE)))["VALUE"] == "first"


# ---------------------------------------------------------------------------- runs through it


def _run(job, code_cache=True):
    target = Target(name="here", local=True, python=space_free_python(), code_cache=code_cache)
    return runner.run_one(target, job, SshPool())


def test_runs_keep_the_runtime_and_our_script_never_a_users(cache_home):
    ping = bundle.script_job("ping")
    first, second = _run(ping), _run(ping)
    assert first.status == second.status == "ok", first.to_dict()
    assert first.summary == second.summary and first.data.keys() == second.data.keys()
    kept = {n.split("-")[0] for n in entries(cache_home)}
    assert kept == {bundle.code_digest(bundle._RUNTIME), bundle.code_digest(ping.script_source)}

    user = b"import sys\nprint('user script', sys.argv[1:])\n"
    script = bundle.Job("run-script", "mine.py", user, argv=("a",), mode="script")
    result = _run(script)
    assert result.status == "ok" and "user script ['a']" in result.data["stdout"]
    assert {n.split("-")[0] for n in entries(cache_home)} == kept      # the user's is not kept


def test_a_crash_in_cached_code_shows_its_traceback_with_source_lines(cache_home):
    """The kept code carries this run's path: the traceback names the run's file and shows
    the failing line, on the first run and on the cached one alike."""
    crashing = bundle.script_job("ping")
    source = crashing.script_source + b"\n\ndef run(args):\n    raise RuntimeError('boom in cached code')\n"
    job = bundle.Job("ping", "ping.py", source, own_code=True)
    for _ in range(2):
        result = _run(job)
        assert result.status == "error" and result.error.layer == "crashed", result.to_dict()
        assert "boom in cached code" in result.error.traceback
        assert "raise RuntimeError('boom in cached code')" in result.error.traceback
    assert len(entries(cache_home)) == 2


def test_code_cache_false_keeps_nothing(cache_home):
    result = _run(bundle.script_job("ping"), code_cache=False)
    assert result.status == "ok"
    assert entries(cache_home) == []


def test_the_runtime_line_names_its_digest_only_when_the_cache_is_allowed():
    job = bundle.script_job("ping")
    for allowed in (True, False):
        header = bundle.build_header(job, target="t", timeout=5, env={}, activate=[], python="p",
                                     nonce="ab", code_cache=allowed)
        payload = bundle.build_payload(header, bundle.job_files(job))
        first = payload.split(b"\n", 1)[0]
        rest = payload[len(first) + 1 + int(first):]
        line = rest.split(b"\n", 1)[0].decode()
        assert line == (f"{len(bundle._RUNTIME)} {bundle.code_digest(bundle._RUNTIME)}" if allowed
                        else str(len(bundle._RUNTIME)))
        stage, runtime, decoded, _ = wire.parse_payload(payload)
        assert runtime == bundle._RUNTIME and stage == wire.STAGE_A
        assert ("code_digests" in decoded) is allowed
    with pytest.raises(ValueError, match="SHA-256"):
        wire.build_payload(b"r", {}, {}, runtime_digest="nothex")
