"""``--prom FILE``: the textfile-collector file, read back with the official Prometheus parser
(prometheus_client.parser), and written atomically without following a link."""

import os
import re
import stat

import pytest
from prometheus_client.parser import text_string_to_metric_families

from diagnostics.builtin.node_check import prom
from diagnostics.core.errors import InputError
from diagnostics.core.results import Finding, Result

HOSTILE = 'gpu"node\\01\nsecond line'


def finding(level, code, message="m", **extra):
    """A results.Finding with the node-check attributes (action, check, gpus, ports)."""
    f = Finding(level=level, code=code, message=message, gpus=extra.pop("gpus", None))
    for key, value in extra.items():
        setattr(f, key, value)
    return f


def node(target, status, findings=(), **data):
    return Result(diagnostic="node-check", target=target, status=status, summary="",
                  findings=list(findings), data=data, duration_s=2.5)


def parse(text):
    """{family name: (type, help, [(labels, value), ...])} via prometheus_client's parser."""
    return {fam.name: (fam.type, fam.documentation, [(s.labels, s.value) for s in fam.samples])
            for fam in text_string_to_metric_families(text)}


def samples(text, name):
    return parse(text)[prom.PREFIX + name][2]


RESULTS = [
    node("h200-a", "ok", checks={"xid": {"status": "ok", "seconds": 0.01},
                                 "dcgm": {"status": "skipped", "seconds": 0}}),
    node("h200-b", "fail", [
        finding("fail", "dcgm-software", action="drain", check="dcgm", gpus=[0, 2]),
        finding("warn", "ib-rate", action="monitor", check="ib", ports=["mlx5_0/1"]),
        finding("fail", "tool-hung", action="reboot", check="nvlink"),
    ], checks={"dcgm": {"status": "fail", "seconds": 31.5}, "nvlink": {"status": "hung", "seconds": 10.0}},
        worst_action="reboot"),
    Result.failure("node-check", "h200-c", "unreachable", "connection refused"),
]


def test_families_types_and_values():
    text = prom.render(RESULTS)
    fams = parse(text)
    assert sorted(fams) == sorted(prom.PREFIX + n for n in prom.HELP)
    assert {t for t, _, _ in fams.values()} == {"gauge"}
    assert samples(text, "status") == [({"target": "h200-a"}, 0), ({"target": "h200-b"}, 2),
                                       ({"target": "h200-c"}, 3)]
    # data.worst_action wins for h200-b (reboot, 4); h200-a has no finding (none, 0); the
    # unreachable h200-c has no worst action at all
    assert samples(text, "worst_action") == [({"target": "h200-a"}, 0), ({"target": "h200-b"}, 4)]
    assert samples(text, "duration_seconds")[0] == ({"target": "h200-a"}, 2.5)
    assert samples(text, "findings") == [({"target": "h200-a"}, 0), ({"target": "h200-b"}, 3),
                                         ({"target": "h200-c"}, 0)]
    assert samples(text, "check_status") == [
        ({"target": "h200-a", "check": "dcgm"}, -1), ({"target": "h200-a", "check": "xid"}, 0),
        ({"target": "h200-b", "check": "dcgm"}, 2), ({"target": "h200-b", "check": "nvlink"}, 3)]
    assert ({"target": "h200-b", "check": "dcgm"}, 31.5) in samples(text, "check_duration_seconds")
    base = {"target": "h200-b", "port": "", "gpu": ""}
    assert samples(text, "finding") == [
        (dict(base, check="dcgm", code="dcgm-software", gpu="0", action="drain", level="fail"), 1),
        (dict(base, check="dcgm", code="dcgm-software", gpu="2", action="drain", level="fail"), 1),
        (dict(base, check="ib", code="ib-rate", port="mlx5_0/1", action="monitor", level="warn"), 1),
        (dict(base, check="nvlink", code="tool-hung", action="reboot", level="fail"), 1),
    ]


def test_help_and_type_once_per_family_and_names_valid():
    text = prom.render(RESULTS)
    helps = re.findall(r"^# HELP (\S+) ", text, re.M)
    types = re.findall(r"^# TYPE (\S+) gauge$", text, re.M)
    assert helps == types and len(helps) == len(set(helps)) == len(prom.HELP)
    for name in helps:
        assert re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", name)
    for line in text.splitlines():
        if not line.startswith("#"):
            assert re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*\{.*\} \S+", line), line
    assert text.endswith("\n")


def test_worst_action_from_findings_when_data_has_none():
    r = node("n", "fail", [finding("warn", "a", action="monitor", check="x"),
                           finding("fail", "b", action="rma", check="x"),
                           finding("fail", "c", action="reset-gpu", check="x")])
    assert samples(prom.render([r]), "worst_action") == [({"target": "n"}, 6)]


def test_findings_without_node_check_attributes_still_export():
    """gpu-status-era findings (no action/check) still give valid samples with empty labels."""
    r = node("n", "warn", [Finding(level="warn", code="persistence-off", message="m", gpus=[1])])
    assert samples(prom.render([r]), "finding") == [
        ({"target": "n", "check": "", "code": "persistence-off", "gpu": "1", "port": "",
          "action": "", "level": "warn"}, 1)]


def test_same_labels_twice_are_one_sample_with_the_count():
    r = node("n", "fail", [finding("fail", "dcgm-targeted-power", "on CPU 0", action="drain", check="dcgm"),
                           finding("fail", "dcgm-targeted-power", "test-wide", action="drain", check="dcgm")])
    assert [v for _, v in samples(prom.render([r]), "finding")] == [2]


def test_hostile_label_values_round_trip():
    r = node(HOSTILE, "fail", [finding("fail", HOSTILE, message='msg "quoted" \\ and\nnewline',
                                       action="drain", check=HOSTILE, gpus=[3],
                                       ports=['mlx5_"0"/1\\'])],
             checks={HOSTILE: {"status": "fail", "seconds": 1}})
    text = prom.render([r])
    assert "msg" not in text                       # messages are not exported
    assert len([l for l in text.splitlines() if not l.startswith("#")]) == 8   # 6 per-target + 2 finding
    assert samples(text, "status") == [({"target": HOSTILE}, 2)]
    assert samples(text, "check_status") == [({"target": HOSTILE, "check": HOSTILE}, 2)]
    assert [labels for labels, _ in samples(text, "finding")] == [
        {"target": HOSTILE, "check": HOSTILE, "code": HOSTILE, "gpu": "3", "port": "",
         "action": "drain", "level": "fail"},
        {"target": HOSTILE, "check": HOSTILE, "code": HOSTILE, "gpu": "", "port": 'mlx5_"0"/1\\',
         "action": "drain", "level": "fail"}]


def test_escape_label_value():
    assert prom.escape_label_value('a\\b"c\nd') == 'a\\\\b\\"c\\nd'


# --- writing -----------------------------------------------------------------------------------

def test_write_creates_the_file_0644_and_leaves_no_temp(tmp_path):
    path = tmp_path / "mldiag.prom"
    old = os.umask(0o077)
    try:
        prom.write(str(path), RESULTS)
    finally:
        os.umask(old)
    assert os.listdir(tmp_path) == ["mldiag.prom"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert path.read_text() == prom.render(RESULTS)
    parse(path.read_text())


def test_write_replaces_atomically(tmp_path):
    path = tmp_path / "mldiag.prom"
    path.write_text("old\n")
    held = open(path)                              # a reader that opened the old file
    inode = path.stat().st_ino
    prom.write(str(path), RESULTS[:1])
    assert held.read() == "old\n"                  # it still sees the whole old file
    held.close()
    assert path.stat().st_ino != inode             # renamed over, not rewritten in place
    assert samples(path.read_text(), "status") == [({"target": "h200-a"}, 0)]
    assert os.listdir(tmp_path) == ["mldiag.prom"]


def test_symlink_at_path_is_refused_and_its_target_untouched(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    link = tmp_path / "mldiag.prom"
    link.symlink_to(victim)
    with pytest.raises(InputError, match="symbolic link"):
        prom.write(str(link), RESULTS)
    assert victim.read_text() == "precious\n"
    assert os.path.islink(link)
    assert sorted(os.listdir(tmp_path)) == ["mldiag.prom", "victim"]


def test_dangling_symlink_is_refused(tmp_path):
    link = tmp_path / "mldiag.prom"
    link.symlink_to(tmp_path / "would-be-created")
    with pytest.raises(InputError, match="symbolic link"):
        prom.write(str(link), RESULTS)
    assert not (tmp_path / "would-be-created").exists()


def test_failed_rename_leaves_old_file_and_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "mldiag.prom"
    path.write_text("old\n")

    def broken_rename(*args, **kwargs):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(prom.os, "rename", broken_rename)
    with pytest.raises(InputError, match="No space left"):
        prom.write(str(path), RESULTS)
    assert path.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["mldiag.prom"]


@pytest.mark.parametrize("name, message", [
    ("mldiag.txt", "must end in .prom"),
    (".prom", "must end in .prom"),
    ("missing-dir/mldiag.prom", "No such file or directory"),
])
def test_bad_paths(tmp_path, name, message):
    with pytest.raises(InputError, match=message):
        prom.write(str(tmp_path / name), RESULTS)


def test_a_directory_at_path_is_refused(tmp_path):
    (tmp_path / "x.prom").mkdir()
    with pytest.raises(InputError, match="not a regular file"):
        prom.write(str(tmp_path / "x.prom"), RESULTS)
    assert os.listdir(tmp_path) == ["x.prom"]


def test_relative_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    prom.write("node.prom", RESULTS)
    assert os.listdir(tmp_path) == ["node.prom"]


# --- defence in depth (issue 29 §0): the wire's gate refuses these; the file is written anyway ---

def test_numbers_past_a_floats_range_are_infinities_not_an_overflow():
    r = node("h", "ok", checks={"xid": {"status": "ok", "seconds": -10**400},
                                "ib": {"status": "ok", "seconds": 2**63 - 1}})
    r.duration_s = 10**400
    text = prom.render([r])
    assert 'mldiag_node_check_duration_seconds{target="h"} +Inf' in text.splitlines()
    assert samples(text, "check_duration_seconds") == [({"target": "h", "check": "ib"}, 2**63 - 1),
                                                       ({"target": "h", "check": "xid"}, float("-inf"))]
    assert 'check="ib"} 9223372036854775807' in text     # an int is written with all its digits


def test_a_lone_surrogate_in_a_label_is_written_as_its_escape(tmp_path):
    r = node("h\udfff", "warn", [finding("warn", "x\ud800", action="monitor", check="xid\udc00")],
             checks={"xid\udc00": {"status": "warn", "seconds": 1}})
    path = tmp_path / "node.prom"
    prom.write(str(path), [r])
    text = path.read_text(encoding="utf-8")
    assert samples(text, "finding") == [({"target": "h\\udfff", "check": "xid\\udc00", "code": "x\\ud800",
                                          "gpu": "", "port": "", "action": "monitor", "level": "warn"}, 1)]
    assert prom.escape_label_value("a\ud800\\") == "a\\\\ud800\\\\"


def test_a_forged_help_line_in_a_label_stays_inside_its_label():
    forged = 'x"} 1\n# HELP mldiag_node_check_status forged\nmldiag_node_check_status{target="victim"} 0'
    text = prom.render([node("h", "fail", [finding("fail", forged, action="drain", check="xid")])])
    assert [l for l in text.splitlines() if l.startswith("# HELP mldiag_node_check_status ")] == [
        f"# HELP mldiag_node_check_status {prom.HELP['status']}"]
    assert samples(text, "status") == [({"target": "h"}, 2)]
    assert [labels["code"] for labels, _ in samples(text, "finding")] == [forged]


@pytest.mark.parametrize("checks", ["xid", ["xid"], 3, None, {"xid": "ok"}, {"xid": {"status": {"a": 1}}},
                                    {"xid": {"status": ["ok"], "seconds": "1"}}])
def test_data_checks_of_any_shape_export_the_rest(checks):
    """A target's data is free-form (the wire's schema checks findings, not data): a check table
    that is not one (found by a fuzz of node-check's outputs) is skipped, never an error."""
    text = prom.render([node("h", "ok", checks=checks)])
    assert samples(text, "status") == [({"target": "h"}, 0)]
    assert samples(text, "check_status") == [] and samples(text, "check_duration_seconds") == []
