"""Runbooks end to end on the lab: `mldiag runbook ...` (a subprocess, as a user runs it) → ssh main
→ sudo → pct 200 → the CT's venv, with the fake nvidia-smi answering from real captures and tiny
CPU models (the setup of test_diagnostics_remote.py: torch and transformers bind-mounted, tiny
Llama and Qwen3-Next models saved by this module).

- each built-in runbook (slow-training, extraction-fails, node-health) with its report checked;
- a team runbook found through hosts.yaml's `runbooks:` that branches (`when:`) and stops early
  (`stop_if:`);
- a refused host: asked once, skipped by the following steps;
- a container stopped between two steps (CT 201, started by the test and stopped again, as the
  lab left it): the next step classifies it (`container`), the one after skips it.

With MLDIAG_RUNBOOK_REPORTS=DIR the built-in runbooks' Markdown reports are copied there (the
README shows them).
"""

import json
import os
import shutil
import textwrap
from pathlib import Path

import pytest

from diagnostics import __version__
from diagnostics.runbooks import model as runbook, run as runbook_run
from diagnostics.engine import runner
from diagnostics.inventory import topology
from tests.integration.test_diagnostics_remote import bind, ct, mldiag, mlenv, tiny_models_in_ct
from tests.programs import findings_by_code


def keep_report(name, save):
    directory = os.environ.get("MLDIAG_RUNBOOK_REPORTS")
    if directory:
        os.makedirs(directory, exist_ok=True)
        shutil.copy(save / "report.md", Path(directory) / f"{name}.md")


@pytest.fixture(scope="module")
def lab_setup(lab, tmp_path_factory):
    """(hosts.yaml, the fixtures' logs dir, {model name: info}). Targets (all pct 200 behind
    ssh main → sudo, unless named otherwise): trainbox (Qwen3-Next tiny model, torch, a GPU held by
    pid 4242), llama (tiny Llama with a tokenizer, torch, healthy GPUs), sickbox (a GPU lost),
    hotbox (HW thermal slowdown), ct201 (pct 201, stopped unless a test starts it), refused
    (nothing listens)."""
    root, models, ml_env, _torch, _transformers = tiny_models_in_ct(lab, "runbooks")
    logs = bind(lab, lambda b: b.name == "fixtures", "tests/fixtures") / "logs"
    smi = "MLDIAG_FAKE_NVIDIA_SMI"
    books = tmp_path_factory.mktemp("team-runbooks")
    (books / "triage.yaml").write_text(textwrap.dedent("""\
        description: look closer where a GPU is unhealthy, and stop there
        params:
          kernel_log: {description: a saved kernel log}
        steps:
          - task: gpu-status
          - id: kernel-log
            task: scan-log
            title: Xid lines, only where gpu-status failed
            when: gpu-status.fail
            stop_if: fail
            args: {path: "{{ params.kernel_log }}"}
          - task: ping
            title: only the targets still in the run
        """))
    hosts = lab.hosts_yaml(textwrap.dedent(f"""\
        defaults: {{connect_timeout: 5, timeout: 240}}
        runbooks: {books}
        hosts:
          main: {{}}
          refused: {{address: 127.0.0.2, port: 1, user: mlsh}}
          pve:
            address: main
            become: sudo
            containers:
        """) + "".join([
        ct("trainbox", gpus=8, env={**ml_env, smi: "derived__h200x8__busy-pid-4242"},
           models={"tiny": models["qwen3next"]["path"]}),
        ct("llama", gpus=8, env={**ml_env, smi: "derived__h200x8__healthy"},
           models={"tiny": models["llama"]["path"]}),
        ct("sickbox", gpus=8, env={smi: "derived__h200x8__gpu-lost"}),
        ct("hotbox", gpus=8, env={smi: "derived__h200x8__hw-thermal-slowdown",
                                  "MLDIAG_FAKE_NVIDIA_SMI_PHASE": "load"}),
        "      ct201: {runtime: pct, id: \"201\", python: /usr/bin/python3.11}\n",
    ]) + "groups:\n  fleet: [trainbox, sickbox, hotbox]\n")
    try:
        yield hosts, logs, models
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_book(hosts, *argv, save):
    r = mldiag("runbook", *argv, "--hosts-file", hosts, "--save", save, timeout=600)
    assert "Traceback" not in r.stderr, r.stderr
    assert (save / "report.md").read_text() == r.stdout
    return r, json.loads((save / "report.json").read_text())


def statuses(doc):
    """{step id: {target: status, or 'skipped: KIND'}}"""
    table = {}
    for step in doc["steps"]:
        row = {r["target"]: r["status"] for r in step["results"]}
        row.update({s["target"]: f"skipped: {s['kind']}" for s in step["skipped"]})
        table[step["id"]] = row
    return table


def results_of(doc, step_id):
    step = next(s for s in doc["steps"] if s["id"] == step_id)
    return {r["target"]: r for r in step["results"]}


def test_slow_training(lab_setup, tmp_path):
    hosts, logs, _models = lab_setup
    save = tmp_path / "slow"
    r, doc = run_book(hosts, "slow-training", "-H", "trainbox,llama",
                      "--param", f"log={logs / 'hf_trainer_nan_loss.log'}", save=save)
    assert r.returncode == 2, r.stdout + r.stderr       # NaN loss in the log: fail
    table = statuses(doc)
    assert table["gpu-status"] == {"trainbox": "ok", "llama": "ok"}
    assert set(table["env-report"]) == {"trainbox", "llama"}
    assert all(s in ("ok", "warn") for s in table["env-report"].values()), table
    assert table["scan-log"] == {"trainbox": "fail", "llama": "fail"}
    attn = results_of(doc, "check-attn")
    assert attn["llama"]["status"] == "ok" and attn["llama"]["error"] is None
    assert attn["llama"]["summary"] == "LlamaForCausalLM: sdpa on 4 attention modules; 4/4 full-attention layers"
    assert attn["trainbox"]["data"]["layers"]["types"] == {"linear_attention": 3, "full_attention": 1}
    if not attn["trainbox"]["data"]["kernels"]["flash-linear-attention"]["installed"]:
        assert attn["trainbox"]["status"] == "warn"
        fla = findings_by_code(attn["trainbox"])["fla-missing"]
        assert f"- **warn** · 3. check-attn · trainbox · `fla-missing`: {fla['message']}" in r.stdout
        assert f"  - hint: {fla['hint']}" in r.stdout
    assert results_of(doc, "gpu-status")["trainbox"]["findings"][0]["code"] == "gpu-busy"

    out = r.stdout
    assert out.startswith("# Runbook `slow-training`\n\nTraining is slow - busy or throttled GPUs")
    assert "- **Targets:** llama,trainbox (2)\n" in out
    assert f"- **Parameters:** `log`=`{logs / 'hf_trainer_nan_loss.log'}`\n" in out
    assert f"- **mldiag:** {__version__} (runbook: built-in)\n" in out
    assert "| 4. scan-log: errors in the training log | fail |" in out    # both targets: one column
    findings = out.split("## Findings\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    levels = [line.split("**")[1] for line in findings if line.startswith("- **")]
    assert levels == sorted(levels, key=["error", "fail", "warn", "info"].index)   # worst first
    assert any(line.startswith("- **fail** · 4. scan-log · llama,trainbox · `nan-loss`: ") for line in findings)
    assert "GPU 3 busy: 71 GiB held by pid 4242 (python)" in out
    assert "<details>\n<summary>8 result documents (JSON)</summary>" in out
    assert json.loads((save / "steps" / "03-check-attn" / "llama.json").read_text())["status"] == "ok"
    keep_report("slow-training", save)

    # without the log: the scan-log step is skipped and says why; the exit code is the worst of
    # the steps that ran
    r, doc = run_book(hosts, "slow-training", "-H", "llama", save=tmp_path / "nolog")
    assert statuses(doc)["scan-log"] == {"llama": "skipped: param"}
    assert "- 4. scan-log on llama: parameter log not given (--param log=VALUE)" in r.stdout
    assert r.returncode == (0 if doc["status"] == "ok" else 1), (r.returncode, doc["status"])


def test_extraction_fails(lab_setup, tmp_path):
    hosts, logs, models = lab_setup
    save = tmp_path / "extract"
    r, doc = run_book(hosts, "extraction-fails", "-H", "llama", "--param", "backend=transformers",
                      "--param", f"log={logs / 'extract_empty_errors.log'}", save=save)
    assert r.returncode == 2, r.stdout + r.stderr
    smoke = results_of(doc, "extract-smoke")["llama"]
    assert smoke["status"] == "ok", (smoke["findings"], smoke["error"])
    d = smoke["data"]
    assert d["backend"] == "transformers" and d["model_class"] == models["llama"]["class"]
    assert [layer["id"] for layer in d["layers"]] == [1, 2, 4] and d["hidden_size"] == 32
    log = results_of(doc, "scan-log")["llama"]
    assert log["status"] == "fail" and list(findings_by_code(log)) == ["traceback", "empty-error"]
    assert "`empty-error`: " in r.stdout and "first at line 5" in r.stdout
    env = results_of(doc, "env-report")["llama"]
    assert env["data"]["packages"]["transformers"] == mlenv.require("transformers").__version__
    keep_report("extraction-fails", save)


def test_node_health_on_a_group(lab_setup, tmp_path):
    hosts, logs, _models = lab_setup
    save = tmp_path / "node"
    r, doc = run_book(hosts, "node-health", "-g", "fleet",
                      "--param", f"kernel_log={logs / 'dmesg_xid.log'}", save=save)
    assert r.returncode == 2, r.stdout + r.stderr
    table = statuses(doc)
    assert table["ping"] == {"trainbox": "ok", "sickbox": "ok", "hotbox": "ok"}
    assert table["gpu-status"] == {"trainbox": "ok", "sickbox": "fail", "hotbox": "fail"}
    assert table["xid"] == {"trainbox": "fail", "sickbox": "fail", "hotbox": "fail"}
    # node-check on the same CTs: sickbox's lost GPU is a reboot; no kernel log is readable for
    # the CT's user (the saved one is only the xid step's), which is a warning, not "no Xid"
    assert table["node-check"] == {"trainbox": "warn", "sickbox": "fail", "hotbox": "warn"}
    node = results_of(doc, "node-check")
    assert [(f["level"], f["code"], f["action"]) for f in node["sickbox"]["findings"]
            if f["level"] == "fail"] == [("fail", "gpu-count", "reboot")]
    assert all("kernel-log-unreadable" in findings_by_code(node[t]) for t in node), node
    assert {node[t]["data"]["worst_action"] for t in node} == {"reboot", "none"}
    gpu = results_of(doc, "gpu-status")
    assert "7 of 8 GPUs visible" in gpu["sickbox"]["summary"] + json.dumps(gpu["sickbox"]["findings"])
    assert "clocks-hw-thermal" in findings_by_code(gpu["hotbox"])
    xid = findings_by_code(results_of(doc, "xid")["sickbox"])
    assert {"xid-fatal", "xid"} <= set(xid)
    out = r.stdout
    assert "| 4. xid: Xid lines in the saved kernel log | fail | fail |" in out
    assert "| Target | GPU | Name | Memory | Util | Temp | Power | Clock events |" in out
    # env drift across the group: only trainbox sees torch (PYTHONPATH)
    drift = out.split("Drift across 3 targets:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert any(line.startswith("- torch: missing on ") and line.endswith(" on trainbox")
               for line in drift), drift
    keep_report("node-health", save)


def test_team_runbook_branches_and_stops_early(lab_setup, tmp_path):
    hosts, logs, _models = lab_setup
    r = mldiag("runbook", "--list", "--hosts-file", hosts)
    assert r.returncode == 0 and "triage" in r.stdout.split()
    r, doc = run_book(hosts, "triage", "-g", "fleet", "--param", f"kernel_log={logs / 'dmesg_xid.log'}",
                      save=tmp_path / "triage")
    assert r.returncode == 2, r.stdout + r.stderr
    assert statuses(doc) == {
        "gpu-status": {"trainbox": "ok", "sickbox": "fail", "hotbox": "fail"},
        "kernel-log": {"trainbox": "skipped: when", "sickbox": "fail", "hotbox": "fail"},
        "ping": {"trainbox": "ok", "sickbox": "skipped: stopped", "hotbox": "skipped: stopped"},
    }
    assert "| 3. ping: only the targets still in the run | ok | skipped (stopped) |" in r.stdout
    assert "- 2. kernel-log on trainbox: when: gpu-status.fail does not hold (it was ok)" in r.stdout
    assert ("- 3. ping on hotbox,sickbox: stopped after step 2 (kernel-log: fail; stop_if: fail)"
            in r.stdout)


def test_an_unreachable_host_is_asked_once(lab_setup, tmp_path):
    hosts, _logs, _models = lab_setup
    r, doc = run_book(hosts, "node-health", "-H", "refused,sickbox", save=tmp_path / "refused")
    assert r.returncode == 3, r.stdout + r.stderr
    table = statuses(doc)
    assert table["ping"]["refused"] == "error"
    assert results_of(doc, "ping")["refused"]["error"]["layer"] == "unreachable"
    for step in ("gpu-status", "env-report"):
        assert table[step]["refused"] == "skipped: unreachable" and table[step]["sickbox"] != "error"
    assert table["xid"] == {"refused": "skipped: param", "sickbox": "skipped: param"}
    assert "- 2. gpu-status on refused: left the run at step 1 (ping): unreachable" in r.stdout
    assert r.stdout.splitlines()[-1] == "</details>"


def test_a_container_stopped_mid_runbook(lab, lab_setup):
    """CT 201 runs for the first step only: the test stops it between steps 1 and 2."""
    from tests.lab import lxc
    hosts, _logs, _models = lab_setup
    book = runbook.loads(textwrap.dedent("""\
        description: three steps
        steps:
          - task: ping
          - task: gpu-status
          - task: env-report
        """), "three.yaml")
    targets = topology.load(str(hosts)).select(["ct201,sickbox"])
    calls = []

    def fleet(targets, job_for, **kw):
        calls.append([t.name for t in targets])
        if len(calls) == 2:      # before step 2: the container goes away
            lxc.stop(lab.lxc_path, 201)
        return runner.run_many(targets, job_for, **kw)

    lxc.start(lab.lxc_path, 201, lab.dir / "lxc-201-runbook.log")
    try:
        record = runbook_run.run(book, targets, {}, run_many=fleet, parallel=4)
    finally:
        lxc.stop(lab.lxc_path, 201)      # as the lab left it: defined, stopped
    ping, gpu, env = record.steps
    assert ping.status_of("ct201") == "ok" and ping.status_of("sickbox") == "ok"
    ct201 = next(r for r in gpu.results if r.target == "ct201")
    assert ct201.status == "error" and ct201.error.layer == "container", ct201.to_dict()
    assert gpu.status_of("sickbox") == "fail"
    assert calls == [["ct201", "sickbox"], ["ct201", "sickbox"], ["sickbox"]]
    assert env.skip_of("ct201") == runbook_run.Skip(
        "ct201", "unreachable", "left the run at step 2 (gpu-status): container")
    assert record.exit_code == 3
    assert lxc.state(lab.lxc_path, 201) == "STOPPED"
