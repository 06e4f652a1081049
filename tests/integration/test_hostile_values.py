"""Valid JSON that still breaks the client (issue 29 §0), against the real lab: a target whose
frame is well-formed and schema-valid but holds a number the client cannot hold (a 401-digit
integer, 1e400, -Infinity, a boolean where a number goes) or a lone surrogate (which no file,
label or stream can encode) is that target's own row; every other target's row is shown, printed
with --json, saved with --save and exported with --prom as usual.

The hostile targets are tests/fixtures/hostile/python (the fake interpreter of
test_hostile_targets.py, reached the same way) over the lab's sshd, beside a healthy lab host
(`good`, over ssh) and the embedded `local`. Before the gate (wire.bounded_values) each of the
first three ended the whole run with "internal error: OverflowError" or UnicodeEncodeError:
no table, no JSON, no .prom file, the save dir without the healthy targets' results.
"""

import json
from functools import partial

from tests import programs
from tests.integration.test_hostile_targets import hostile_host, saved

mldiag = partial(programs.mldiag, timeout=300)

# mode of the fake -> what the protocol row must name (where, and what)
OUT_OF_BOUNDS = {
    "int-401-duration": "duration_s: an integer of 401 digits",
    "int-401-seconds": "data.checks.xid.seconds: an integer of 401 digits",
    "float-1e400": "data.temperature_c: inf, not a finite number",
    "minus-infinity": "the result is not JSON (-Infinity is not JSON)",
    "bool-duration": "duration_s is a boolean, not a number",
}
# let in: a number exactly at the bound; lone surrogates, as their escapes
LET_IN = ("int-at-bound", "surrogates")
GOOD = ("good", "local")
BAD = [f"bad-{mode}" for mode in OUT_OF_BOUNDS]
NAMES = list(GOOD) + BAD + [f"bad-{mode}" for mode in LET_IN]


def _hosts(lab):
    return lab.hosts_yaml("hosts:\n  good: {address: main}\n"
                          + "".join(hostile_host(lab, f"bad-{m}", m) for m in (*OUT_OF_BOUNDS, *LET_IN)))


def _assert_rows(docs: dict) -> None:
    """Each target its own row: the healthy ones whole, each out-of-bounds one a protocol row
    saying what and where, the surrogates escaped (six characters each, as the table shows)."""
    assert set(docs) == set(NAMES), sorted(docs)
    for name in GOOD:
        assert docs[name]["status"] == "ok" and docs[name]["error"] is None, docs[name]
    for mode, reason in OUT_OF_BOUNDS.items():
        doc = docs[f"bad-{mode}"]
        assert doc["status"] == "error" and doc["error"]["layer"] == "protocol", doc
        assert doc["error"]["message"].startswith(
            f"the target answered with a malformed result: {reason}"), doc["error"]["message"]
    at_bound = docs["bad-int-at-bound"]
    assert at_bound["status"] == "ok" and at_bound["data"] == {"max": 2**63 - 1, "min": -(2**63 - 1)}
    lone = docs["bad-surrogates"]
    assert lone["status"] == "warn" and lone["summary"] == "lone \\udfff", lone
    assert [(f["code"], f["message"]) for f in lone["findings"]] == [("x\\ud800", "m\\udbff")]
    assert lone["data"]["\\ud800key"] == "v\\udc00"


def test_out_of_bounds_values_are_rows_of_their_own_in_the_table_the_json_and_the_save_dir(
        lab, tmp_path):
    hosts = _hosts(lab)
    save = tmp_path / "save"
    r = mldiag("ping", "--hosts-file", hosts, "-H", ",".join(NAMES), "--save", save)
    assert r.returncode == 3, (r.returncode, r.stdout, r.stderr)
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    files = saved(save)
    _assert_rows({n: d for n, d in files.items() if n != "summary"})
    assert files["summary"]["targets"] == {n: files[n]["status"] for n in NAMES}
    for name in NAMES:
        assert name in r.stdout, (name, r.stdout)
    assert "x\\ud800: m\\udbff" in r.stdout

    j = mldiag("ping", "--hosts-file", hosts, "-H", ",".join(NAMES), "--json")
    assert j.returncode == 3, (j.returncode, j.stdout, j.stderr)
    assert "internal error" not in j.stderr, j.stderr
    docs = {d["target"]: d for d in json.loads(j.stdout)}
    _assert_rows(docs)
    assert docs["good"]["data"]["python"] and docs["local"]["data"]["python"]


def test_the_prometheus_file_is_written_for_every_target(lab, tmp_path):
    """node-check --prom: the file is written (before: no file at all, after the table), the
    healthy targets' metrics in it as the official parser reads them, each bad target `3`
    (not checked), the surrogates as their escapes in the labels."""
    from prometheus_client.parser import text_string_to_metric_families

    hosts = _hosts(lab)
    prom, save = tmp_path / "node.prom", tmp_path / "save"
    r = mldiag("node-check", "--hosts-file", hosts, "-H", ",".join(NAMES), "--no-dcgm",
               "--prom", prom, "--save", save)
    assert r.returncode == 3, (r.returncode, r.stdout, r.stderr)
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    families = {f.name: f for f in text_string_to_metric_families(prom.read_text(encoding="utf-8"))}
    status = {s.labels["target"]: s.value for s in families["mldiag_node_check_status"].samples}
    healthy = {name: saved(save)[name]["status"] for name in GOOD}
    assert status == {**{n: {"ok": 0, "warn": 1, "fail": 2, "error": 3}[s] for n, s in healthy.items()},
                      **{n: 3 for n in BAD}, "bad-int-at-bound": 0, "bad-surrogates": 1}, status
    checks = {(s.labels["target"], s.labels["check"])
              for s in families["mldiag_node_check_check_status"].samples}
    assert {("good", "xid"), ("local", "xid"), ("bad-surrogates", "xid\\ud800")} <= checks, checks
    codes = {(s.labels["target"], s.labels["code"])
             for s in families["mldiag_node_check_finding"].samples}
    assert ("bad-surrogates", "x\\ud800") in codes, codes
    assert not {target for target, _ in codes} & set(BAD)
