"""What the wire's gate lets in, every output can take (issue 29 §0): a document that
``wire.decode_result`` accepts, however hostile its values, renders in the table, the per-GPU
rows, the full view, the action view, --json, --prom and the fleet comparison, and each encodes
to UTF-8, without an exception.  The gate itself is tested in test_wire.py; these are the views
behind it, fed documents generated around the gate's bounds (and found by a fuzz of node-check's
outputs with the hostile fake's ``doc`` mode)."""

import io
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diagnostics.builtin.node_check import baseline, view as node_view, prom
from diagnostics.views import render
from diagnostics.builtin.gpu_status import view as gpu_view
from diagnostics.core import wire
from diagnostics.core.results import ACTIONS, Result

EDGE_INTS = [0, -1, 1, wire.MAX_INT, -wire.MAX_INT]
EDGE_FLOATS = [0.5, 5e-324, 1.7976931348623157e308, -1.7976931348623157e308]
HOSTILE_TEXT = ["", "\ud800", "x\udfff\n\x1b[2J", "ok", "fail", "drain", "gpu0", "9" * 5000,
                "gpu" + "9" * 5000 + ".x", "\u202e", '"} 1\n# HELP x'] + list(ACTIONS)

scalars = st.one_of(st.none(), st.booleans(), st.sampled_from(EDGE_INTS), st.sampled_from(EDGE_FLOATS),
                    st.integers(-10**6, 10**6), st.sampled_from(HOSTILE_TEXT), st.text(max_size=8))
keys = st.one_of(st.sampled_from(HOSTILE_TEXT + ["checks", "facts", "gpus", "seconds", "status",
                                                 "worst_action", "kernel", "gpu0.temp"]),
                 st.text(max_size=6))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                      st.dictionaries(keys, inner, max_size=4)),
                      max_leaves=12)
texts = st.one_of(st.sampled_from(HOSTILE_TEXT), st.text(max_size=8))
findings = st.fixed_dictionaries(
    {"level": st.sampled_from(["info", "warn", "fail", "x"]), "code": texts, "message": texts},
    optional={"hint": texts, "action": st.sampled_from(ACTIONS), "check": texts,
              "gpus": st.lists(st.one_of(st.sampled_from(EDGE_INTS), texts), max_size=3),
              "ports": st.lists(texts, max_size=2)})
data = st.fixed_dictionaries({}, optional={"checks": values, "facts": st.dictionaries(keys, values, max_size=4),
                                           "gpus": values, "worst_action": values}).flatmap(
    lambda d: st.dictionaries(keys, values, max_size=3).map(lambda extra: {**extra, **d}))
documents = st.fixed_dictionaries({
    "schema": st.just(2), "diagnostic": st.sampled_from(["node-check", "gpu-status", "ping"]),
    "target": texts, "status": st.sampled_from(["ok", "warn", "fail", "error"]),
    "summary": texts, "findings": st.lists(findings, max_size=3), "data": data,
    "log": st.just([]), "error": st.none(),
    "duration_s": st.one_of(st.sampled_from(EDGE_INTS), st.sampled_from(EDGE_FLOATS))})


def _let_in(doc, target):
    """The document as a target would send it (json.dumps escapes each lone surrogate), through
    the gate; its Result as the runner makes it."""
    result = Result.from_dict(wire.decode_result(json.dumps(doc).encode("utf-8")))
    result.target = target
    return result


def _every_output(results):
    for show in (render.render_table, gpu_view.render_gpus, render.render_full,
                 node_view.render_actions, render.render_json):
        out = io.StringIO()
        show(results, out)
        out.getvalue().encode("utf-8")
    prom.render(results).encode("utf-8")
    baseline.deviations(results, None)
    baseline.deviations(results, baseline.document(results))
    json.dumps(baseline.document(results), ensure_ascii=False).encode("utf-8")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(documents, min_size=3, max_size=4))
def test_whatever_the_gate_lets_in_every_output_takes(docs):
    _every_output([_let_in(doc, f"n{i}") for i, doc in enumerate(docs)])


def test_a_fact_naming_a_gpu_by_5000_digits_names_no_gpu():
    """Found by the fuzz: ``gpu<5,000 digits>.x`` as a fact key was int()-ed past Python's
    4,300-digit limit (ValueError: node-check with 3 nodes ended in an internal error)."""
    long_key = "gpu" + "9" * 5000 + ".temp"
    nodes = [Result("node-check", f"n{i}", "ok", "", data={"facts": {long_key: int(i == 0), "gpu3.temp": int(i == 0)}})
             for i in range(3)]
    found = baseline.deviations(nodes, None)["n0"]
    assert sorted((f.gpus or []) for f in found) == [[], [3]], found
