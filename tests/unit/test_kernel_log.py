"""kernel_log.py: the one reader of the kernel log (gpu-status's boot log, node-check's window,
a saved file). node-check's window is tested through xid.read_kernel_log in test_xid.py; this
boot's log with its one budget, and what decides which tool is worth starting, here."""

import collections

from tests.programs import load_script, script_imports
from tests.programs import REPO

kl = load_script("kernel_log.py", "mldiag_test_kernel_log")
Tool = collections.namedtuple("Tool", "status rc out err seconds")
XID_LINE = "2025-02-23T16:24:18+0000 gpu01 kernel: NVRM: Xid (PCI:0000:91:00): 79, pid=1, x\n"


def fake_tools(answers):
    """run_tool answering from {argv[0]: Tool}; unlisted tools are missing."""
    calls = []

    def run_tool(argv, timeout):
        calls.append(list(argv))
        return answers.get(argv[0]) or Tool("missing", None, "", "", 0.0)
    return run_tool, calls


def test_a_system_journal_is_found_where_journald_keeps_it(tmp_path):
    persistent, volatile = tmp_path / "var", tmp_path / "run"
    (persistent / "0a1b").mkdir(parents=True)
    (persistent / "0a1b" / "user-1000.journal").write_text("")
    dirs = (str(persistent), str(volatile))
    everything = lambda path: True  # noqa: E731
    assert not kl.system_journal_readable(dirs, everything)      # a user's own journal only
    (volatile / "0a1b").mkdir(parents=True)
    archived = volatile / "0a1b" / "system@00061c-5c.journal~"
    archived.write_text("")
    assert kl.system_journal_readable(dirs, everything)
    assert not kl.system_journal_readable(dirs, lambda path: path != str(archived))
    assert kl.system_journal_readable(dirs, lambda path: path == str(archived))


def test_this_boots_log_reads_kmsg_first_and_starts_no_tool(monkeypatch):
    """since=None (gpu-status): /dev/kmsg first; where it answers, no process is started."""
    run_tool, calls = fake_tools({"dmesg": Tool("ok", 0, XID_LINE, "", 0.1)})
    monkeypatch.setattr(kl, "read_kmsg", lambda deadline, max_bytes: "[ 5.0] NVRM: Xid (PCI:0000:91:00): 79, x")
    log = kl.read(run_tool, since=None, timeout=5)
    assert calls == [] and (log["source"], log["error"]) == ("/dev/kmsg", None)
    assert log["text"].startswith("[ 5.0] NVRM")


def test_this_boots_log_shares_one_budget(monkeypatch):
    """The budget bounds every source together: a dmesg that used it up leaves journalctl
    unstarted ("no time left"), where node-check's window gives each tool its own timeout."""
    monkeypatch.setattr(kl, "read_kmsg", lambda deadline, max_bytes: (_ for _ in ()).throw(OSError(2, "No such file or directory")))
    monkeypatch.setattr(kl, "system_journal_readable", lambda: True)
    clock = [1000.0]
    monkeypatch.setattr(kl.time, "monotonic", lambda: clock[0])
    timeouts = []

    def run_tool(argv, timeout):
        timeouts.append((argv[0], timeout))
        clock[0] += 4.9                        # dmesg took nearly all of the 5 s
        return Tool("ok", 1, "", "dmesg: read kernel buffer failed: Operation not permitted\n", 4.9)
    log = kl.read(run_tool, since=None, timeout=5)
    assert timeouts == [("dmesg", 5.0)]
    assert log["error"] == ("/dev/kmsg: No such file or directory; dmesg: dmesg: read kernel buffer failed: "
                            "Operation not permitted; journalctl: no time left")
    clock[0] = 1000.0
    run_tool, calls = fake_tools({})
    kl.read(run_tool, since="24h", timeout=0.1)
    assert [c[0] for c in calls] == ["journalctl", "dmesg"]      # a short timeout still runs each


def test_python38_syntax_and_stdlib_only():
    from pathlib import Path
    imported = script_imports(Path(REPO) / "diagnostics" / "scripts" / "kernel_log.py", module_level=True)
    assert imported == {"__future__", "_remote", "errno", "json", "os", "sys", "time"}
