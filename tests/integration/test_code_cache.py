"""The target's code cache over SSH (issue 14): the lab user's own ~/.cache/mldiag/code, from
the password database, holds the runtime and gpu-status compiled after the first run, owned by
that user, 0600 in 0700 directories; the second run answers the same from it. Unit tests
(tests/unit/test_code_cache.py) have the refusals."""

import pwd
import shutil
import stat
from pathlib import Path

from diagnostics.engine import bundle, runner
from diagnostics.inventory import topology


def test_the_lab_users_cache_keeps_our_code_and_answers_alike(lab):
    user = pwd.getpwnam("mlsh")
    directory = Path(user.pw_dir) / ".cache" / "mldiag" / "code"
    shutil.rmtree(directory, ignore_errors=True)
    topo = topology.load(str(lab.hosts_yaml("hosts:\n  main: {}\n  nocache: {address: main, code_cache: false}\n")))
    job = bundle.script_job("gpu-status")
    skipped = runner.run_many([topo.targets["nocache"]], job)
    assert skipped[0].status in ("ok", "warn", "fail"), skipped[0].to_dict()
    assert not directory.exists()
    first = runner.run_many([topo.targets["main"]], job)[0]
    kept = sorted(p.name.split("-")[0] for p in directory.iterdir())
    assert kept == sorted([bundle.code_digest(bundle._RUNTIME), bundle.code_digest(job.script_source)])
    for path in [directory, directory.parent] + list(directory.iterdir()):
        st = path.stat()
        assert st.st_uid == user.pw_uid
        assert stat.S_IMODE(st.st_mode) == (0o700 if path.is_dir() else 0o600)
    second = runner.run_many([topo.targets["main"]], job)[0]
    assert (first.status, first.summary) == (second.status, second.summary) == \
        (skipped[0].status, skipped[0].summary)
    assert [f.to_dict() for f in first.findings] == [f.to_dict() for f in second.findings]
