"""The target-side runtime against hostile neighbours on the target (issue 10 items 2, 3, 14),
on the real lab.

- Another local user (``runuser -u nobody``) renames every ``mldiag-*`` dir it can in a shared
  temp parent and plants a symlink to a directory of root's in its place, while a root runtime
  runs there: a parent others can write without the sticky bit is refused (`upload`), a sticky
  one (1777) holds, and root's directory is never touched.
- ``--keep-remote`` with ``env: {HF_TOKEN: ...}`` leaves no file holding the token, on the host
  and in a container, for a forked and a spawned child.
- A fork-hopping descendant, on the host over ssh and in the CT behind pct, is killed every time.
"""

import json
import os
import shutil
import subprocess
import textwrap
import time
import uuid
from functools import partial

import pytest

from diagnostics.engine import bundle, runner
from diagnostics.inventory import topology
from tests import programs
from tests.lab.util import pids_with_marker
from tests.unit.test_runtime import HOPPER, HOPPER_DIAGNOSTIC, HOPPER_LIFETIME_S, survivors

VENV_PY = "/root/venv/bin/python"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SYSTEM_PY = "/usr/bin/python3"   # the attacker's interpreter: readable by nobody

# Runs as nobody: forever swaps any mldiag-* directory it can in the watched parents for a
# symlink to VICTIM; prints what it did and what the kernel refused.
ATTACKER = r"""
import os, sys, time
victim, until, parents = sys.argv[1], time.time() + float(sys.argv[2]), sys.argv[3:]
told = set()
print("watching", *parents, flush=True)
while time.time() < until:
    for parent in parents:
        for name in os.listdir(parent):
            path = os.path.join(parent, name)
            if not name.startswith("mldiag-") or name.endswith(".moved") or os.path.islink(path):
                continue
            try:
                os.rename(path, path + ".moved")
                os.symlink(victim, path)
                print("swapped", path, flush=True)
            except OSError as e:
                if path not in told:
                    told.add(path)
                    print("refused", path, e.strerror, flush=True)
    time.sleep(0.0002)
"""

PROBE = """\
import os, time
time.sleep(1.0)     # time for the attacker to try
print("ran in", os.path.dirname(os.getcwd()))
"""


mldiag = partial(programs.mldiag, timeout=180)


@pytest.fixture
def playground():
    """/var/tmp/mldiag-untrusted-X/: `shared` (0777, no sticky bit), `sticky` (1777), and `victim`:
    root's directory of files (0755/0644) that the attacker points its symlinks at."""
    top = f"/var/tmp/mldiag-untrusted-{uuid.uuid4().hex[:8]}"
    os.makedirs(top)
    os.chmod(top, 0o755)
    dirs = {name: os.path.join(top, name) for name in ("shared", "sticky", "victim")}
    for name, mode in (("shared", 0o777), ("sticky", 0o1777), ("victim", 0o755)):
        os.mkdir(dirs[name])
        os.chmod(dirs[name], mode)
    os.mkdir(os.path.join(dirs["victim"], "etc"))
    for rel in ("important.conf", "etc/cron.line"):
        with open(os.path.join(dirs["victim"], rel), "w") as f:
            f.write("root's own " + rel)
    try:
        yield dirs
    finally:
        shutil.rmtree(top, ignore_errors=True)


def victim_state(victim):
    out = {}
    for root, dirs, files in os.walk(victim):
        for name in dirs + files:
            path = os.path.join(root, name)
            st = os.lstat(path)
            content = open(path).read() if name in files else None
            out[os.path.relpath(path, victim)] = (st.st_uid, oct(st.st_mode), content)
    return out


@pytest.fixture
def attacker(playground):
    proc = subprocess.Popen(["runuser", "-u", "nobody", "--", SYSTEM_PY, "-c", ATTACKER,
                             playground["victim"], "120", playground["shared"], playground["sticky"]],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = proc.stdout.readline()
    assert first.startswith("watching"), first + proc.stdout.read()
    yield proc
    if proc.poll() is None:
        proc.terminate()
        proc.wait(10)


def test_a_user_planting_symlinks_in_a_shared_temp_parent_cannot_make_root_remove_anything(
        lab, playground, attacker, tmp_path):
    """Three root targets on `main`: one with tmpdir: in the non-sticky 0777 dir the attacker
    works in (refused: `upload`, naming the dir and why), one in the sticky 1777 dir it also works
    in (runs; the attacker's rename is refused by the kernel), one in the default /tmp. Root's
    victim directory is untouched; the other targets' results are intact in the table and in
    --save; the exit code is the worst status (error: 3); nothing is `internal`."""
    before = victim_state(playground["victim"])
    assert len(before) == 3
    hosts_file = lab.hosts_yaml(textwrap.dedent(f"""\
        defaults: {{connect_timeout: 5, timeout: 60}}
        hosts:
          shared: {{address: main-root, tmpdir: {playground["shared"]}}}
          sticky: {{address: main-root, tmpdir: {playground["sticky"]}}}
          plain: {{address: main-root}}
        """))
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    save = tmp_path / "saved"
    r = mldiag("run-script", "--path", str(script), "--hosts-file", str(hosts_file),
               "-H", "shared,sticky,plain", "--save", str(save))
    attacker.terminate()
    said = attacker.communicate(timeout=10)[0]
    # first of all: root's directory as it was (the old runtime emptied it and reported ok)
    assert victim_state(playground["victim"]) == before, said
    assert r.returncode == 3, (r.stdout, r.stderr)
    assert "internal" not in r.stdout + r.stderr
    docs = {name: json.loads((save / f"{name}.json").read_text()) for name in ("shared", "sticky", "plain")}
    assert sorted(os.listdir(save)) == ["plain.json", "shared.json", "sticky.json", "summary.json"]
    shared = docs["shared"]
    assert shared["status"] == "error" and shared["error"]["layer"] == "upload", shared
    assert shared["error"]["type"] == "UnsafeTempParent"
    assert playground["shared"] in shared["error"]["message"]
    assert "without the sticky bit (mode 0777)" in shared["error"]["message"]
    for name, where in (("sticky", playground["sticky"]), ("plain", "/tmp")):
        doc = docs[name]
        assert doc["status"] == "ok" and doc["data"]["stdout"] == f"ran in {where}\n", doc
    # the table: the refused target's row, and the other two (folded: same outcome) ok
    rows = {frozenset(line.split()[0].split(",")): line.split()[1:] for line in r.stdout.splitlines()
            if line[:1].strip()}
    assert rows[frozenset(["shared"])][:2] == ["error", "upload:"], r.stdout
    assert rows[frozenset(["plain", "sticky"])][:1] == ["ok"], r.stdout
    # nothing of ours left in either parent
    assert os.listdir(playground["shared"]) == []
    assert os.listdir(playground["sticky"]) == []
    # the attacker did try, in the sticky dir, and the kernel said no
    assert "refused " + playground["sticky"] + "/mldiag-" in said, said
    assert "swapped" not in said, said


def test_keep_remote_leaves_no_secret_on_the_target(lab, tmp_path):
    """`env: HF_TOKEN` with --keep-remote, on the host (forked child; spawned child: an
    interpreter-start variable in env) and in CT 200 behind sudo + pct (spawned): the diagnostic
    got the token, and no file in any kept dir holds it (no header, no result file)."""
    token = "hf_" + uuid.uuid4().hex + "KeptNowhere"
    hosts_file = lab.hosts_yaml(textwrap.dedent(f"""\
        defaults: {{connect_timeout: 5, timeout: 60}}
        hosts:
          forked: {{address: main, env: {{HF_TOKEN: "{token}"}}}}
          spawned: {{address: main, env: {{HF_TOKEN: "{token}", PYTHONDONTWRITEBYTECODE: "1"}}}}
          pve:
            address: main
            become: sudo
            containers:
              in-ct:
                runtime: pct
                id: "200"
                python: {VENV_PY}
                env: {{HF_TOKEN: "{token}", PYTHONDONTWRITEBYTECODE: "1"}}
        """))
    script = tmp_path / "uses_token.py"
    script.write_text("import os\nprint('token length', len(os.environ['HF_TOKEN']))\n")
    r = mldiag("run-script", "--path", str(script), "--hosts-file", str(hosts_file),
               "-H", "forked,spawned,in-ct", "--keep-remote", "--json")
    assert r.returncode == 0, (r.stdout, r.stderr)
    docs = {d["target"]: d for d in json.loads(r.stdout)}
    ct_root = f"/proc/{lab.container_pids(200, include_init=True)[0]}/root"
    kept = {}
    try:
        for name, doc in docs.items():
            assert doc["status"] == "ok" and doc["data"]["stdout"] == f"token length {len(token)}\n", doc
            kept[name] = (ct_root if name == "in-ct" else "") + doc["data"]["remote_tmpdir"]
        for name, path in kept.items():
            files = sorted(os.listdir(path))
            spawned = name != "forked"
            assert files == sorted(["uses_token.py"] + ([".mldiag-runtime.py"] if spawned else [])), (name, files)
            for f in files:
                with open(os.path.join(path, f), "rb") as fh:
                    assert token.encode() not in fh.read(), (name, f)
    finally:
        for path in kept.values():
            shutil.rmtree(path, ignore_errors=True)


def test_a_fork_hopper_is_killed_on_the_host_and_in_a_container(lab):
    """A setsid descendant that forks and exits every half millisecond, left behind by a finished
    diagnostic, on the host over ssh and in CT 200 behind sudo + pct: five rounds, and no process
    with the round's marker survives any of them (the host's /proc shows the CT's processes too)."""
    topo = topology.load(str(lab.hosts_yaml(textwrap.dedent(f"""\
        defaults: {{connect_timeout: 5, timeout: 60}}
        hosts:
          main: {{}}
          pve:
            address: main
            become: sudo
            containers:
              trainbox: {{runtime: pct, id: "200", python: {VENV_PY}}}
        """))))
    targets = [topo.targets["main"], topo.targets["trainbox"]]
    left = []
    for attempt in range(5):
        marker = f"mldiag-lab-hopper-{uuid.uuid4().hex[:8]}"

        def job_for(target):
            return bundle.Job("demo", "demo.py", textwrap.dedent(HOPPER_DIAGNOSTIC).encode(),
                              argv=(f"{marker}-{target.name}", "1" if attempt % 2 else "0",
                                    str(HOPPER_LIFETIME_S), HOPPER))

        results = runner.run_many(targets, job_for)
        for r in results:
            assert r.status == "ok" and r.summary == "left a fork-hopper behind", r.to_dict()
        if survivors(marker):
            left.append((attempt, [p for p in pids_with_marker(marker)]))
    assert left == [], f"fork-hoppers survived: {left}"
