"""Issue 29 §1 through the real lab: the secret shapes diagnostics/core/redact.py once let through,
printed by a script and quoted by a log's tracebacks on real targets, reach no output.

- run-script: a script prints every shape of tests/unit/test_redact.py's ISSUE_29_SHAPES (one
  per line; some span lines: a split .netrc entry, a YAML block scalar), then a private key cut
  off after its BEGIN line and the twelve log lines that followed it. On the `main` host (ssh,
  user mlsh) and in CT 200 (ssh main → sudo → pct → /root/venv/bin/python): no secret in the
  table, in `--json`, in the `--save` dir's files; the twelve lines are kept.
- scan-log: a log written in the CT holds one traceback per one-line shape, the shape in its
  exception message; scan-log's findings and matches (built on the target) quote those lines:
  no secret in any of its outputs, every traceback still counted.

The client masks the whole result document of every target (runner.run_one), so scan-log's
findings are masked where run-script's stdout is: the two runs show it for both."""

import json
import uuid
from functools import partial

import pytest

from diagnostics.core import redact
from tests import programs
from tests.unit.test_redact import ISSUE_29_SHAPES, TWELVE_LINES

mldiag = partial(programs.mldiag, timeout=240)
VENV_PY = "/root/venv/bin/python"

# The short ones (`WANDB_API_KEY=abc`) could occur by chance in other output (a temp dir's
# name): they are checked on their own line of the script's output instead.
LONG_SECRETS = sorted({secret for _, secret in ISSUE_29_SHAPES if len(secret) >= 8})
ONE_LINE_SHAPES = [text for text, _ in ISSUE_29_SHAPES if "\n" not in text]


@pytest.fixture(scope="module")
def hosts(lab):
    lab.need("lxc")
    ct = f'{{runtime: pct, id: "200", python: {VENV_PY}}}'
    return lab.hosts_yaml("defaults: {connect_timeout: 5, timeout: 120}\nhosts:\n  main: {}\n"
                          f"  pve: {{address: main, become: sudo, containers: {{ct: {ct}}}}}\n")


def leaked(texts):
    """The secrets that show in any of ``texts``."""
    return [secret for secret in LONG_SECRETS if any(secret in text for text in texts)]


def runs(tmp_path, *argv):
    """``mldiag ARGV`` as a table, with --json and with --save: (everything each printed and
    saved, the --json documents by target)."""
    outputs = []
    save = tmp_path / f"saved-{uuid.uuid4().hex[:8]}"
    for extra in ([], ["--json"], ["--save", str(save)]):
        r = mldiag(*argv, *extra)
        assert "Traceback" not in r.stderr, r.stderr
        outputs += [r.stdout, r.stderr]
        if extra == ["--json"]:
            docs = {d["target"]: d for d in json.loads(r.stdout)}
    saved = sorted(save.iterdir())
    assert saved, "--save wrote nothing"
    outputs += [p.read_text() for p in saved]
    return outputs, docs


def test_a_script_printing_every_shape_shows_none_of_them(hosts, tmp_path):
    script = tmp_path / "prints_shapes.py"
    script.write_text(
        "import sys\n"
        f"for text in {[text for text, _ in ISSUE_29_SHAPES]!r}:\n"
        "    print(text)\n"
        "print('-----BEGIN RSA PRIVATE KEY-----')\n"
        f"sys.stdout.write({TWELVE_LINES!r})\n"
        "print('the end')\n")
    outputs, docs = runs(tmp_path, "run-script", script, "--hosts-file", hosts, "-H", "main,ct")
    assert leaked(outputs) == []
    for name in ("main", "ct"):
        doc = docs[name]
        assert doc["status"] == "ok", doc
        stdout = doc["data"]["stdout"]
        # masked, and what is around each secret kept
        assert "WANDB_API_KEY=<redacted>\n" in stdout and "HF_TOKEN=<redacted>\n" in stdout
        assert "machine api.example.com login alice password <redacted>\n" in stdout
        assert "mysql -h db -u root -p<redacted> training\n" in stdout
        # the key cut off after its BEGIN line costs only that line
        assert stdout.endswith(f"<redacted>\n{TWELVE_LINES}the end\n"), stdout[-2000:]


def test_scan_log_findings_quoting_every_shape_show_none_of_them(hosts, tmp_path):
    log = f"/tmp/mldiag-redaction-{uuid.uuid4().hex}.log"
    tracebacks = "".join(
        "Traceback (most recent call last):\n"
        f'  File "/opt/train.py", line {40 + i}, in <module>\n'
        "    main()\n"
        f"RuntimeError: request {i} failed: {text}\n"
        f"2026-12-04 10:00:{i:02d} INFO step {i} loss=2.31\n"
        for i, text in enumerate(ONE_LINE_SHAPES))
    writer = tmp_path / "write_log.py"
    writer.write_text(f"with open({log!r}, 'w') as f:\n    f.write({tracebacks!r})\n")
    remover = tmp_path / "remove_log.py"
    remover.write_text(f"import os\nos.remove({log!r})\n")
    r = mldiag("run-script", writer, "--hosts-file", hosts, "-H", "ct", "--json")
    assert r.returncode == 0, (r.stdout, r.stderr)
    try:
        outputs, docs = runs(tmp_path, "scan-log", "--hosts-file", hosts, "-H", "ct",
                             "--path", log)
    finally:
        r = mldiag("run-script", remover, "--hosts-file", hosts, "-H", "ct", "--json")
        assert r.returncode == 0, (r.stdout, r.stderr)
    assert leaked(outputs) == []
    doc = docs["ct"]
    assert doc["status"] == "fail", doc
    assert doc["data"]["counts"]["traceback"] == len(ONE_LINE_SHAPES)
    # the findings quote the exception lines, masked: the text around each secret is still there
    messages = " ".join(f["message"] for f in doc["findings"])
    assert "RuntimeError: request 0 failed: machine api.example.com login alice password " \
           "<redacted>" in messages, messages
    # and each traceback's exception line is the line the target read, masked as the client
    # masks that shape anywhere
    assert [m["text"] for m in doc["data"]["matches"]["traceback"]] == \
        [f"RuntimeError: request {i} failed: {redact.redact_text(text)}"
         for i, text in enumerate(ONE_LINE_SHAPES)]
