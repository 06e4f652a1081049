"""node-check's golden configuration (issue 34 item 4; builtin/node_check/golden.py): the fleet's
majority written as a commented YAML file and read back, per-group sections, the file's bad
input named by file, line and key, each node's drift, hosts.yaml's ``baseline:`` key, the GPU
settings node-check now reads from nvidia-smi (the fake answering real captures), and the two
commands end to end on local targets (a real run of node-check on this machine, each target's
nvidia-smi the fake on a capture of its own)."""

import json
import os
import textwrap

import pytest

from diagnostics.builtin.node_check import baseline, golden
from diagnostics.core.errors import InputError
from diagnostics.core.results import Result
from diagnostics.inventory import topology
from tests.programs import FAKE_NVIDIA_SMI, load_script, mldiag

nc = load_script("node_check.py", "mldiag_test_node_check_golden")

H200 = {"driver": "590.48.01", "cuda": "13.1", "kernel": "6.8.0-45-generic", "gpu.count": 8,
        "gpu.model": "NVIDIA H200", "gpu.gpu3.ecc_mode": "Enabled", "gpu.gpu3.power_limit_w": 700.0,
        "nvlink.gpu3.active": 18, "ib.mlx5_0/1.rate": 400, "host.persistenced": True,
        "nvlink.gpu3.speed": None}
H100 = {**H200, "gpu.model": "NVIDIA H100 80GB HBM3", "gpu.gpu3.power_limit_w": 650.0}


def node(target, facts=H200, **changes):
    facts = dict(facts)
    for key, value in changes.items():
        key = key.replace("__", ".")
        if value is golden._MISSING:
            facts.pop(key, None)
        else:
            facts[key] = value
    return Result(diagnostic="node-check", target=target, status="ok", summary="",
                  data={"facts": facts})


def by_key(entries):
    return {e.key: e for e in entries}


# ------------------------------------------------------------------ the majority

def test_a_strict_majority_decides_and_the_odd_nodes_are_kept_for_the_comment():
    nodes = [(f"n{i}", dict(H200)) for i in range(1, 4)]
    nodes[2][1]["driver"] = "550.54.15"
    got = by_key(golden.entries(nodes))
    assert got["driver"].value == "590.48.01"
    assert got["driver"].odd() == (("550.54.15", ("n3",)),)
    assert got["cuda"].odd() == ()


def test_no_strict_majority_is_undecided_with_every_value_and_its_nodes():
    nodes = [("a", dict(H200)), ("b", {**H200, "driver": "550.54.15"})]
    entry = by_key(golden.entries(nodes))["driver"]
    assert not entry.decided
    assert {v: n for v, n in entry.seen} == {"590.48.01": ("a",), "550.54.15": ("b",)}


def test_one_node_is_its_own_majority():
    entry = by_key(golden.entries([("good", dict(H200))]))["driver"]
    assert entry.decided and entry.value == "590.48.01"


def test_a_fact_most_nodes_lack_is_undecided_and_one_most_have_is_decided():
    nodes = [("a", dict(H200)), ("b", {**H200, "ofed": "24.10"}), ("c", dict(H200))]
    nodes[2][1].pop("cuda")
    got = by_key(golden.entries(nodes))
    assert not got["ofed"].decided                                # on 1 of 3 nodes
    assert got["cuda"].value == "13.1" and got["cuda"].odd() == ((golden._MISSING, ("c",)),)


def test_numbers_vote_as_numbers_text_and_booleans_keep_their_type():
    nodes = [("a", {"x": 18}), ("b", {"x": 18.0}), ("c", {"x": "18"}), ("d", {"x": True}),
             ("e", {"x": 18})]
    entry = by_key(golden.entries(nodes))["x"]
    assert entry.decided and entry.value == 18 and not isinstance(entry.value, bool)
    assert {n for _, ns in entry.odd() for n in ns} == {"c", "d"}


def test_error_rows_are_left_out_and_named():
    results = [node("a"), node("b"), Result.failure("node-check", "c", "unreachable", "refused")]
    p = golden.plan(results)
    assert p.nodes == ("a", "b") and p.left_out == (("c", "unreachable: refused"),)


# ------------------------------------------------------------------ groups

def test_a_group_whose_majority_differs_gets_its_own_values_and_its_absent_facts():
    results = [node(f"h200-{i}") for i in range(1, 4)] + [
        node("h100-1", H100, nvlink__gpu3__active=golden._MISSING),
        node("h100-2", H100, nvlink__gpu3__active=golden._MISSING)]
    groups = {"all": [r.target for r in results], "h200": ["h200-1", "h200-2", "h200-3"],
              "h100": ["h100-1", "h100-2"]}
    p = golden.plan(results, groups)
    assert [s.name for s in p.groups] == ["h100"]      # "all" is the fleet; h200 is its majority
    (section,) = p.groups
    assert {e.key: e.value for e in section.entries} == {
        "gpu.model": "NVIDIA H100 80GB HBM3", "gpu.gpu3.power_limit_w": 650.0}
    assert section.absent == ("nvlink.gpu3.active",) and section.members == ("h100-1", "h100-2")


def test_a_fact_half_a_group_lacks_is_for_a_person_to_decide_not_absent():
    results = [node(f"a{i}") for i in range(1, 6)] + [
        node("g1", ib__ports=golden._MISSING), node("g2", ib__ports=golden._MISSING),
        node("g3", ib__ports=4), node("g4", ib__ports=2)]
    for r in results:
        r.data["facts"].setdefault("ib.ports", 8) if r.target.startswith("a") else None
    (section,) = golden.plan(results, {"g": ["g1", "g2", "g3", "g4"]}).groups
    assert section.absent == () and [(e.key, e.decided) for e in section.entries] == [("ib.ports", False)]
    text = golden.render(golden.plan(results, {"g": ["g1", "g2", "g3", "g4"]}), written="now")
    assert "      #   (not reported by g[1-2])" in text and "      # ib.ports: 4   # g3" in text


def test_a_slurm_node_row_belongs_to_its_login_targets_groups():
    results = [node("a"), node("b"), node("b2"), node("cluster:n1", H100), node("cluster:n2", H100)]
    p = golden.plan(results, {"slurm": ["cluster"]})
    assert p.groups[0].members == ("cluster:n1", "cluster:n2")


def test_expected_takes_the_first_group_section_of_the_file_then_the_fleet():
    g = golden.loads(textwrap.dedent("""\
        schema: 1
        facts: {driver: "590.48.01", gpu.model: "NVIDIA H200", nvlink.gpu3.active: 18}
        groups:
          h100: {facts: {gpu.model: "NVIDIA H100 80GB HBM3"}, absent: [nvlink.gpu3.active]}
          odd: {facts: {gpu.model: "other", driver: "550.54.15", nvlink.gpu3.active: 12}}
        """), "golden.yaml")
    got = {k: (f.value, src) for k, (f, src) in g.expected(["odd", "h100"]).items()}
    assert got == {"driver": ("550.54.15", "groups.odd"),
                   "gpu.model": ("NVIDIA H100 80GB HBM3", "groups.h100")}
    assert {k: f.value for k, (f, _) in g.expected([]).items()} == {
        "driver": "590.48.01", "gpu.model": "NVIDIA H200", "nvlink.gpu3.active": 18}


# ------------------------------------------------------------------ the file, round trip

def test_the_written_file_reads_back_with_every_type_and_undecided_facts_commented(tmp_path):
    results = [node("n1"), node("n2"), node("n3", driver="550.54.15", ofed="24.10")]
    text = golden.render(golden.plan(results), written="2026-12-07T08:00:00+00:00",
                         hosts_file="/etc/hosts.yaml")
    assert "# 3 node(s): n[1-3]; hosts file /etc/hosts.yaml." in text
    assert 'driver: "590.48.01"   # differs: "550.54.15" on n3' in text.splitlines()[
        text.splitlines().index("  # -- node") + 2]
    assert '# ofed: "24.10"   # n3' in text
    g = golden.loads(text, "golden.yaml")
    assert g.written == "2026-12-07T08:00:00+00:00"
    assert {k: f.value for k, f in g.facts.items()} == H200     # ofed commented out: not read
    for key, value in H200.items():
        assert type(g.facts[key].value) is type(value), key


def test_uncommenting_an_undecided_line_makes_it_a_fact():
    text = golden.render(golden.plan([node("a"), node("b", driver="550.54.15")]), written="now")
    assert "driver" not in golden.loads(text, "g.yaml").facts
    edited = text.replace('  # driver: "550.54.15"', '  driver: "550.54.15"')
    assert golden.loads(edited, "g.yaml").facts["driver"].value == "550.54.15"


def test_hostile_fact_names_and_values_stay_one_line_and_read_back_exactly():
    odd_key, odd_value = 'x\ny: 1 "q"', 'v\nz: 2 # "q" \u2028'
    dotted = 'k\nz: 1.gpu0'      # its family (before the first dot) heads a comment line
    results = [node("a", {odd_key: odd_value, "yes": "no", "on": True, dotted: 1}),
               node("b", {odd_key: "other", dotted: 2}), node("c", {odd_key: "third", dotted: 3})]
    text = golden.render(golden.plan(results), written="now")
    g = golden.loads(text, "g.yaml")
    assert set(g.facts) == set()          # every one undecided: all commented out
    for line in text.splitlines():
        assert line.startswith(("#", "  #", "schema", "written", "mldiag", "nodes", "facts")) \
            or not line, line
    decided = golden.render(golden.plan([node("a", {odd_key: odd_value, "yes": "no", "on": True})]),
                            written="now")
    assert {k: f.value for k, f in golden.loads(decided, "g.yaml").facts.items()} == {
        odd_key: odd_value, "yes": "no", "on": True}


def test_a_group_section_reads_back(tmp_path):
    results = [node("a"), node("b"), node("c"), node("d", H100), node("e", H100)]
    text = golden.render(golden.plan(results, {"h100": ["d", "e"]}), written="now")
    g = golden.loads(text, "g.yaml")
    assert {k: f.value for k, f in g.groups["h100"].items()} == {
        "gpu.model": "NVIDIA H100 80GB HBM3", "gpu.gpu3.power_limit_w": 650.0}
    assert g.absent["h100"] == ()


# ------------------------------------------------------------------ bad input: file, line, key

@pytest.mark.parametrize("text, where, problem", [
    ("schema: 1\nfacts: {driver: 1}\nextra: 2\n", "g.yaml:3: extra: ", "unknown key"),
    ("facts: {driver: x}\n", "g.yaml:1: ", "no schema"),
    ("schema: 2\nfacts: {}\n", "g.yaml:1: schema: ", "expected 1, got 2"),
    ("schema: true\n", "g.yaml:1: schema: ", "expected 1"),
    ("schema: 1\nfacts:\n  driver: [1, 2]\n", "g.yaml:3: facts.driver: ", "expected one value"),
    ("schema: 1\nfacts:\n  a: {b: 1}\n", "g.yaml:3: facts.a: ", "expected one value"),
    ("schema: 1\nfacts: [1]\n", "g.yaml:2: facts: ", "expected a mapping of fact names"),
    ("schema: 1\nfacts:\n  a: .nan\n", "g.yaml:3: facts.a: ", "expected one value"),
    ("schema: 1\ngroups:\n  h100:\n    fact: {a: 1}\n", "g.yaml:4: groups.h100.fact: ", "unknown key"),
    ("schema: 1\ngroups:\n  h100:\n    absent: a\n", "g.yaml:4: groups.h100.absent: ",
     "expected a list of fact names"),
    ("schema: 1\ngroups:\n  h100:\n    absent:\n      - 3\n", "g.yaml:5: groups.h100.absent[0]: ",
     "expected a fact name"),
    ("schema: 1\ngroups: [a]\n", "g.yaml:2: groups: ", "expected a mapping of hosts.yaml group"),
    ("schema: 1\nfacts: {a: 1, a: 2}\n", "g.yaml:2: facts.a: ", "duplicate key"),
    ("schema: 1\nfacts: {a: 1\n", "g.yaml:", "invalid YAML"),
    ("", "g.yaml:1: ", "empty file"),
    ("- 1\n", "g.yaml:1: ", "expected a mapping with schema and facts"),
    ("schema: 1\nwritten: 3\n", "g.yaml:2: written: ", "expected text"),
])
def test_a_bad_golden_file_names_file_line_and_key(text, where, problem):
    with pytest.raises(InputError) as caught:
        golden.loads(text, "g.yaml")
    assert str(caught.value).startswith(where) and problem in str(caught.value), str(caught.value)


def test_a_section_for_a_group_hosts_yaml_lacks_is_bad_input_at_its_line():
    g = golden.loads("schema: 1\nfacts: {}\ngroups:\n  h10:\n    facts: {a: 1}\n", "g.yaml")
    with pytest.raises(InputError, match=r"^g.yaml:4: groups.h10: not a group of the hosts file "
                                         r"h.yaml \(did you mean 'h100'"):
        golden.check_groups(g, {"h100": ("a",)}, "h.yaml")


def test_a_missing_or_binary_file_is_bad_input(tmp_path):
    with pytest.raises(InputError, match="cannot read"):
        golden.load(str(tmp_path / "none.yaml"))
    (tmp_path / "bin.yaml").write_bytes(b"schema: 1\n\xff\n")
    with pytest.raises(InputError, match=r"bin.yaml:2: not UTF-8"):
        golden.load(str(tmp_path / "bin.yaml"))


# ------------------------------------------------------------------ drift

def test_drift_names_each_fact_its_golden_value_and_now():
    g = golden.loads('schema: 1\nfacts: {driver: "590.48.01", gpu.count: 8, ib.ports: 8, '
                     'cuda: 13.1, nvlink.gpu3.speed: null}\n', "g.yaml")
    facts = {"driver": "550.54.15", "gpu.count": 8.0, "cuda": "13.1", "nvlink.gpu3.speed": None,
             "extra.fact": 1}
    got = golden.drift(facts, g.expected([]))
    assert [(d.key, d.golden, d.now, d.missing) for d in got] == [
        ("driver", "590.48.01", "550.54.15", False), ("ib.ports", 8, None, True)]
    assert [golden.drift_message(d) for d in got] == [
        "driver 550.54.15, golden 590.48.01", "ib.ports: missing, golden 8"]


def test_text_and_a_number_that_print_alike_are_shown_typed():
    g = golden.loads('schema: 1\nfacts: {x: "18"}\n', "g.yaml")
    (d,) = golden.drift({"x": 18}, g.expected([]))
    assert golden.drift_message(d) == 'x 18, golden "18"'


def test_the_diff_table_names_each_drift_its_section_the_nodes_alike_and_those_not_compared():
    import io
    g = golden.loads(textwrap.dedent("""\
        schema: 1
        written: "2026-12-07T08:00:00+00:00"
        facts: {driver: "590.48.01", ib.ports: 8}
        groups:
          h100: {facts: {gpu.model: "NVIDIA H100 80GB HBM3"}}
        """), "golden.yaml")
    results = [node("a", {"driver": "590.48.01", "ib.ports": 8}),
               node("b", {"driver": "550.54.15", "gpu.model": "NVIDIA H200\x1b[2J"}),
               Result.failure("node-check", "c", "unreachable", "connection refused")]
    nodes = golden.diff_nodes(results, g, {"h100": ["b"]})
    assert golden.diff_exit_code(nodes) == 3 and golden.diff_exit_code(nodes[:2]) == 2
    assert golden.diff_exit_code(nodes[:1]) == 0
    out = io.StringIO()
    golden.render_diff(nodes, g, out)
    assert out.getvalue().splitlines() == [
        "golden file: golden.yaml (written 2026-12-07T08:00:00+00:00)",
        "TARGET  FACT       GOLDEN                 NOW                 FROM",
        "b       driver     590.48.01              550.54.15           facts",
        "b       gpu.model  NVIDIA H100 80GB HBM3  NVIDIA H200\\x1b[2J  groups.h100",
        "b       ib.ports   8                      (missing)           facts",
        "no drift: a",
        "not compared: c: unreachable: connection refused"]
    assert [d["status"] for d in golden.diff_json(nodes, g)] == ["same", "drift", "error"]


def test_judgement_uses_each_targets_golden_file_and_the_majority_for_the_rest(tmp_path):
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "golden.yaml").write_text(
        'schema: 1\nfacts: {driver: "590.48.01"}\ngroups:\n  h100:\n    facts: {driver: "550.1"}\n')
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(textwrap.dedent("""\
        hosts:
          a: {local: true, baseline: g/golden.yaml}
          b: {local: true, baseline: g/golden.yaml}
          x: {local: true}
          y: {local: true}
          z: {local: true}
        groups:
          h100: [b]
        """))
    judged = golden.judgement(None, topology.load(str(hosts)))
    found = judged([node("a", driver="1.0"), node("b", driver="550.1"), node("x"), node("y"),
                    node("z", driver="2.0")])
    assert {t: [f.message for f in fs] for t, fs in found.items()} == {
        "a": ["driver 1.0, golden 590.48.01"], "b": [],
        "x": [], "y": [], "z": ["driver 2.0, 2 of 3 nodes: 590.48.01"]}
    assert {(f.code, f.level, f.action, f.check) for f in found["a"]} == {
        ("baseline-deviation", "warn", "monitor", "baseline")}


def test_baseline_flag_reads_a_golden_file_or_the_json_baseline(tmp_path):
    gold, saved = tmp_path / "golden.yaml", tmp_path / "saved.json"
    gold.write_text('# a comment first\nschema: 1\nfacts: {driver: "590.48.01"}\n')
    baseline.save(str(saved), [node("a")])
    assert golden.looks_like_golden(str(gold)) and not golden.looks_like_golden(str(saved))
    found = golden.judgement(str(gold))([node("a", driver="1.0")])
    assert [f.message for f in found["a"]] == ["driver 1.0, golden 590.48.01"]
    found = golden.judgement(str(saved))([node("a", driver="1.0")])
    assert [f.message for f in found["a"]] == ["driver 1.0, baseline 590.48.01"]


def test_a_bad_golden_file_named_in_hosts_yaml_is_bad_input_naming_both(tmp_path):
    (tmp_path / "golden.yaml").write_text("schema: 1\nfacts:\n  driver: [1]\n")
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text("defaults: {baseline: golden.yaml}\nhosts:\n  a: {local: true}\n")
    with pytest.raises(InputError) as caught:
        golden.judgement(None, topology.load(str(hosts)))
    assert str(caught.value).startswith(f"{tmp_path}/golden.yaml:3: facts.driver: expected one value")


# ------------------------------------------------------------------ hosts.yaml's baseline key

def test_the_baseline_key_is_relative_to_the_hosts_file_and_inherited(tmp_path):
    topo = topology.loads(textwrap.dedent("""\
        defaults: {baseline: golden.yaml}
        hosts:
          a: {local: true}
          b: {local: true, baseline: ~/other.yaml}
          pve:
            address: pve
            baseline: /abs/pve.yaml
            containers:
              ct: {runtime: pct, id: 200}
              ct2: {runtime: pct, id: 201, baseline: sub/ct2.yaml}
        """), str(tmp_path / "conf" / "hosts.yaml"))
    assert topo.targets["a"].baseline == str(tmp_path / "conf" / "golden.yaml")
    assert topo.targets["b"].baseline == os.path.expanduser("~/other.yaml")
    assert topo.targets["ct"].baseline == "/abs/pve.yaml"
    assert topo.targets["ct2"].baseline == str(tmp_path / "conf" / "sub" / "ct2.yaml")
    assert topology.loads("hosts:\n  a: {local: true}\n", "h.yaml").targets["a"].baseline is None


def test_a_bad_baseline_key_names_file_line_and_key():
    with pytest.raises(InputError, match=r"^h.yaml:3: hosts.a.baseline: expected a golden file"):
        topology.loads("hosts:\n  a:\n    baseline: [x]\n", "h.yaml")


# ------------------------------------------------------------------ writing

def test_init_never_overwrites_a_reviewed_file_without_force_nor_writes_through_a_link(tmp_path):
    path = tmp_path / "golden.yaml"
    path.write_text("reviewed\n")
    with pytest.raises(InputError, match="golden.yaml: --out: exists"):
        golden.write(str(path), "new\n")
    assert path.read_text() == "reviewed\n"
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    path.unlink()
    path.symlink_to(victim)
    golden.write(str(path), "new\n", force=True)
    assert victim.read_text() == "keep\n" and not path.is_symlink() and path.read_text() == "new\n"


# ------------------------------------------------------------------ node-check's GPU settings

def test_the_inventory_reads_each_gpus_settings_from_the_capture(tool_dir):
    gpus, findings, _ = nc.inventory(nc.ToolRunner(path=str(tool_dir)), 10)
    assert findings == [] and len(gpus) == 8
    facts = nc.inventory_facts(gpus)
    # the values of the H200 capture (tests/fixtures/nvidia-smi), units dropped (nounits);
    # application clocks are "[Requested functionality has been deprecated]" there: no fact
    assert {k: v for k, v in facts.items() if k.startswith("gpu.gpu3.")} == {
        "gpu.gpu3.ecc_mode": "Enabled", "gpu.gpu3.persistence_mode": "Enabled",
        "gpu.gpu3.mig_mode": "Disabled", "gpu.gpu3.compute_mode": "Default",
        "gpu.gpu3.power_limit_w": 700.0, "gpu.gpu3.max_clock_graphics_mhz": 1980,
        "gpu.gpu3.max_clock_memory_mhz": 3201}


def test_an_nvidia_smi_without_a_settings_field_still_lists_the_gpus(tool_dir, tmp_path, monkeypatch):
    capture = tmp_path / "old.txt"
    capture.write_text("base linux-x86_64__nvidia-h200__590.48.01.txt\ngpus 8\n"
                       "drop-field mig.mode.current\n")
    log = tmp_path / "argv.jsonl"
    monkeypatch.setenv("MLDIAG_FAKE_NVIDIA_SMI", str(capture))
    monkeypatch.setenv("MLDIAG_FAKE_NVIDIA_SMI_LOG", str(log))
    gpus, findings, note = nc.inventory(nc.ToolRunner(path=str(tool_dir)), 10)
    assert findings == [] and note is None and len(gpus) == 8
    assert not any(k.startswith("gpu.gpu") for k in nc.inventory_facts(gpus))
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert [c[0].count(",") for c in calls] == [6 + len(nc.SETTING_FIELDS), 6], calls


def test_the_ecc_off_capture_differs_from_the_healthy_one_by_one_gpu_setting(tool_dir, monkeypatch):
    def facts(capture):
        monkeypatch.setenv("MLDIAG_FAKE_NVIDIA_SMI", capture)
        return nc.inventory_facts(nc.inventory(nc.ToolRunner(path=str(tool_dir)), 10)[0])
    healthy, off = facts("derived__h200x8__healthy"), facts("derived__h200x8__ecc-off-gpu3")
    assert {k for k in healthy if healthy[k] != off.get(k)} == {"gpu.gpu3.ecc_mode"}


# ------------------------------------------------------------------ the commands, end to end

@pytest.fixture
def fleet(tmp_path):
    """Three local targets, each running node-check with the fake nvidia-smi on PATH (the
    capture its env names), and a writer of the hosts file (one node's capture changed)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    os.symlink(FAKE_NVIDIA_SMI, bindir / "nvidia-smi")
    from tests.programs import space_free_python

    def hosts(n3="derived__h200x8__healthy", extra="", more=""):
        env = lambda capture: json.dumps({"PATH": f"{bindir}:/usr/bin:/bin",  # noqa: E731
                                          "MLDIAG_FAKE_NVIDIA_SMI": capture})
        path = tmp_path / "hosts.yaml"
        path.write_text(f"defaults: {{python: {space_free_python()}{extra}}}\nhosts:\n"
                        + "".join(f"  n{i}: {{local: true, env: {env(c)}}}\n" for i, c in
                                  ((1, "derived__h200x8__healthy"), (2, "derived__h200x8__healthy"),
                                   (3, n3)))
                        + more + "groups:\n  h200: [n1, n2, n3]\n")
        return path
    return hosts


def test_init_then_one_node_changed_then_the_diff_names_that_node_and_fact(fleet, tmp_path):
    hosts = fleet()
    r = mldiag("baseline-init", "-g", "h200", "--out", "golden.yaml", "--hosts-file", hosts,
               cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("wrote golden.yaml: ") and "from 3 node(s) (n[1-3])" in r.stdout
    text = (tmp_path / "golden.yaml").read_text()
    assert text.startswith("# mldiag golden configuration") and "gpu.gpu3.ecc_mode: \"Enabled\"" in text
    r = mldiag("baseline-init", "-g", "h200", "--out", "golden.yaml", "--hosts-file", hosts,
               cwd=tmp_path)
    assert r.returncode == 4 and "golden.yaml: --out: exists" in r.stderr

    r = mldiag("baseline-diff", "golden.yaml", "-g", "h200", "--hosts-file", hosts, cwd=tmp_path)
    assert (r.returncode, r.stdout.splitlines()[1:]) == (0, ["no drift: n[1-3]"]), r.stdout + r.stderr

    hosts = fleet(n3="derived__h200x8__ecc-off-gpu3")
    r = mldiag("baseline-diff", "golden.yaml", "-g", "h200", "--hosts-file", hosts, "--json",
               cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    drifted = {d["target"]: d["drift"] for d in json.loads(r.stdout) if d["drift"]}
    assert drifted == {"n3": [{"fact": "gpu.gpu3.ecc_mode", "golden": "Enabled", "now": "Disabled",
                               "missing": False, "from": "facts"}]}
    r = mldiag("baseline-diff", "golden.yaml", "-g", "h200", "--hosts-file", hosts, cwd=tmp_path)
    assert r.stdout.splitlines()[1].split() == ["TARGET", "FACT", "GOLDEN", "NOW", "FROM"]
    assert r.stdout.splitlines()[2].split() == ["n3", "gpu.gpu3.ecc_mode", "Enabled", "Disabled", "facts"]

    # hosts.yaml's baseline: node-check itself judges every node against the golden file
    hosts = fleet(n3="derived__h200x8__ecc-off-gpu3", extra=", baseline: golden.yaml")
    r = mldiag("node-check", "-g", "h200", "--no-dcgm", "--json", "--hosts-file", hosts, cwd=tmp_path)
    found = {d["target"]: [f["message"] for f in d["findings"] if f["check"] == "baseline"]
             for d in json.loads(r.stdout)}
    assert found == {"n1": [], "n2": [], "n3": ["gpu.gpu3.ecc_mode: Disabled, golden Enabled"]}

    # and a runbook's node-check step judges the same way (the step runs the task's judgement
    # with the run's hosts file): the built-in node-health runbook
    r = mldiag("runbook", "node-health", "-g", "h200", "--json", "--hosts-file", hosts, cwd=tmp_path)
    steps = {s["id"]: s for s in json.loads(r.stdout)["steps"]}
    found = {x["target"]: [f["message"] for f in x["findings"] if f["check"] == "baseline"]
             for x in steps["node-check"]["results"]}
    assert found == {"n1": [], "n2": [], "n3": ["gpu.gpu3.ecc_mode: Disabled, golden Enabled"]}, r.stdout


def test_a_bad_golden_file_stops_node_check_before_anything_runs(fleet, tmp_path):
    (tmp_path / "golden.yaml").write_text("schema: 1\nfacts:\n  driver: {a: 1}\n")
    hosts = fleet(extra=", baseline: golden.yaml")
    r = mldiag("node-check", "-g", "h200", "--no-dcgm", "--hosts-file", hosts, cwd=tmp_path)
    assert r.returncode == 4 and r.stdout == "", r.stdout + r.stderr
    assert r.stderr.startswith(f"mldiag: {tmp_path}/golden.yaml:3: facts.driver: expected one value")
    r = mldiag("baseline-diff", "golden.yaml", "-g", "h200", "--hosts-file", hosts, cwd=tmp_path)
    assert r.returncode == 4 and r.stderr.startswith("mldiag: golden.yaml:3: facts.driver: "), r.stderr


def test_a_node_without_facts_is_left_out_and_named_and_no_facts_at_all_writes_nothing(fleet, tmp_path):
    hosts = fleet(more="  gone: {local: true, python: /nonexistent/python3}\n")
    r = mldiag("baseline-init", "-H", "n1,gone", "--out", "golden.yaml", "--hosts-file", hosts,
               cwd=tmp_path)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "left out: gone: interpreter: " in r.stdout, r.stdout
    header = (tmp_path / "golden.yaml").read_text().split("\n\n")[0]
    assert "# 1 node(s): n1;" in header and "# Left out (no facts): gone: interpreter: " in header
    r = mldiag("baseline-init", "-H", "gone", "--out", "none.yaml", "--hosts-file", hosts, cwd=tmp_path)
    assert r.returncode == 3 and "--out none.yaml: not written: no node reported facts" in r.stderr
    assert not (tmp_path / "none.yaml").exists()
    r = mldiag("baseline-init", "-H", "n1", "--hosts-file", hosts, cwd=tmp_path)
    assert r.returncode == 4 and "--out: expected a file name" in r.stderr


def test_a_saved_result_set_is_read_instead_of_running_node_check(fleet, tmp_path):
    hosts = fleet(n3="derived__h200x8__ecc-off-gpu3")
    r = mldiag("node-check", "-g", "h200", "--no-dcgm", "--save", "saved", "--hosts-file", hosts,
               cwd=tmp_path)
    assert sorted(os.listdir(tmp_path / "saved")) == ["n1.json", "n2.json", "n3.json", "summary.json"]
    r = mldiag("baseline-init", "--results", "saved", "--out", "golden.yaml", "--hosts-file", hosts,
               cwd=tmp_path)
    assert r.returncode == 0 and "from 3 node(s) (n[1-3])" in r.stdout, r.stdout + r.stderr
    text = (tmp_path / "golden.yaml").read_text()
    assert '  gpu.gpu3.ecc_mode: "Enabled"   # differs: "Disabled" on n3' in text.splitlines()
    assert "(`mldiag baseline-init --results saved`)" in text
    r = mldiag("baseline-diff", "golden.yaml", "--results", "saved", "--json", "--hosts-file", hosts,
               cwd=tmp_path)
    assert r.returncode == 2
    assert {d["target"]: [x["fact"] for x in d["drift"]] for d in json.loads(r.stdout)} == {
        "n1": [], "n2": [], "n3": ["gpu.gpu3.ecc_mode"]}
    r = mldiag("baseline-diff", "golden.yaml", "--results", "saved", "-H", "n1", "--hosts-file", hosts,
               cwd=tmp_path)
    assert r.returncode == 4 and "-H/-g select nothing there" in r.stderr
    (tmp_path / "saved" / "n2.json").write_text('{"schema": 2, "target": "n2"}')
    r = mldiag("baseline-diff", "golden.yaml", "--results", "saved", "--hosts-file", hosts, cwd=tmp_path)
    assert r.returncode == 4 and r.stderr.startswith("mldiag: saved/n2.json: --results: not a result "
                                                     "mldiag saved: "), r.stderr
