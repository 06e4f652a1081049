#!/usr/bin/env python3
"""Stand-in for ``kubectl`` (1.32, this machine's), for the few commands node-check's
``--taint`` / ``--condition`` / ``--untaint`` send, with kubectl's own output, messages and exit
codes (kubectl.SOURCE.md names the source each one follows):

  get pods|pod|po [-n NS] NAME... -o json     the Pod, or a List of those found; NotFound errors
  get nodes|node|no NAME... -o json           the same for nodes (cluster-scoped)
  taint node|nodes NAME KEY[=VALUE]:EFFECT    "node/NAME tainted"
  taint node|nodes NAME KEY:EFFECT-           "node/NAME untainted"
  patch node|nodes NAME --subresource status --type strategic (--patch-file FILE | -p PATCH)
                                              "node/NAME patched" / "patched (no change)"

The cluster is a JSON file, ``$MLDIAG_FAKE_KUBECTL_STATE``: {"namespace": the context's
namespace (default "default"), "pods": {"NS/NAME": Pod}, "nodes": {"NAME": Node}}; a change is
written back to it. Each call's argv is appended as one JSON line to
``$MLDIAG_FAKE_KUBECTL_LOG`` (when set), and a patch file's bytes beside it. Without a state
file it answers as kubectl does with no cluster to reach.

Standard library only.
"""

import datetime
import json
import os
import sys

NO_SERVER = ("The connection to the server localhost:8080 was refused - did you specify the "
             "right host or port?\n")
# before it, klog's line for each discovery attempt (memcache.go), five of them
NO_SERVER_LOG = ('E{time} {pid:>7} memcache.go:265] "Unhandled Error" err="couldn\'t get current '
                 'server API group list: Get \\"http://localhost:8080/api?timeout=32s\\": dial '
                 'tcp 127.0.0.1:8080: connect: connection refused"\n')
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
KINDS = {"pods": "pods", "pod": "pods", "po": "pods", "nodes": "nodes", "node": "nodes",
         "no": "nodes"}


class Exit(Exception):
    def __init__(self, stderr: str, code: int = 1, stdout: str = ""):
        super().__init__(stderr)
        self.stderr, self.code, self.stdout = stderr, code, stdout


def go_json(obj) -> str:
    """kubectl's JSON printer: Go's json.MarshalIndent(obj, "", "    ") of an unstructured
    object (map keys sorted; <, >, & and U+2028/2029 escaped as Go does), then a newline."""
    text = json.dumps(obj, indent=4, sort_keys=True, ensure_ascii=False)
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                    ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(ch, esc)
    return text + "\n"


def not_found(resource: str, name: str) -> str:
    # cmdutil.StandardErrorMessage of an APIStatus with a Reason
    return f'Error from server (NotFound): {resource} "{name}" not found\n'


def parse(argv):
    """kubectl's (cobra's) flags anywhere among the words: (words, flags)."""
    words, flags, i = [], {}, 0
    takes = {"-n": "namespace", "--namespace": "namespace", "-o": "output", "--output": "output",
             "--subresource": "subresource", "--type": "type", "--patch-file": "patch-file",
             "-p": "patch", "--patch": "patch"}
    while i < len(argv):
        a = argv[i]
        if a == "--":
            words += argv[i + 1:]
            break
        if a.startswith("-") and a != "-":
            name, eq, value = a.partition("=")
            if name == "--overwrite":
                flags["overwrite"] = value != "false"
            elif name in takes:
                if not eq:
                    i += 1
                    if i >= len(argv):
                        raise Exit(f"error: flag needs an argument: {name!r} in {a}\n")
                    value = argv[i]
                flags[takes[name]] = value
            else:
                raise Exit(f"error: unknown flag: {name}\nSee 'kubectl --help' for usage.\n")
        else:
            words.append(a)
        i += 1
    return words, flags


def get(state, words, flags):
    if flags.get("output") != "json":
        raise Exit("error: this stand-in prints -o json only\n")
    kind = KINDS.get(words[0]) if words else None
    if kind is None:
        raise Exit(f'error: the server doesn\'t have a resource type "{words[0] if words else ""}"\n')
    names = words[1:]
    ns = flags.get("namespace") or state.get("namespace", "default")
    found, errors = [], ""
    for name in names:
        obj = state[kind].get(f"{ns}/{name}" if kind == "pods" else name)
        if obj is None:
            # kubectl's builder asks for the namespace of a namespaced object not found and
            # names the namespace when it is missing (this cluster's namespaces: its pods')
            missing_ns = kind == "pods" and not any(k.split("/")[0] == ns for k in state["pods"])
            errors += not_found("namespaces", ns) if missing_ns else not_found(kind, name)
        else:
            found.append(obj)
    # get.go printGeneric: one name given and found is the object itself; any other case a List
    # of what was found (then the errors); one name not found prints nothing but the error
    if len(names) == 1:
        if errors:
            raise Exit(errors)
        return go_json(found[0])
    out = go_json({"apiVersion": "v1", "items": found, "kind": "List",
                   "metadata": {"resourceVersion": ""}})
    if errors:
        raise Exit(errors, 1, out)
    return out


def parse_taint(spec: str):
    """utils.go parseTaint, for the forms KEY=VALUE:EFFECT, KEY:EFFECT, KEY."""
    parts = spec.split(":")
    if len(parts) == 1:
        return {"key": parts[0]}
    if len(parts) != 2:
        raise Exit(f"error: invalid taint spec: {spec}\n")
    if parts[1] not in EFFECTS:
        raise Exit(f"error: invalid taint effect: {parts[1]}, unsupported taint effect\n")
    kv = parts[0].split("=")
    if len(kv) > 2:
        raise Exit(f"error: invalid taint spec: {spec}\n")
    taint = {"key": kv[0], "effect": parts[1]}
    if len(kv) == 2 and kv[1]:
        taint["value"] = kv[1]
    return taint


def to_string(t) -> str:
    """core/v1 Taint.ToString."""
    key, value, effect = t.get("key", ""), t.get("value", ""), t.get("effect", "")
    if not effect:
        return f"{key}={value}:" if value else key
    return f"{key}={value}:{effect}" if value else f"{key}:{effect}"


def taint(state, words, flags):
    if len(words) < 3 or KINDS.get(words[0]) != "nodes":
        raise Exit("error: at least one taint update is required\n")
    name, specs = words[1], words[2:]
    node = state["nodes"].get(name)
    if node is None:
        raise Exit(not_found("nodes", name))
    adds = [parse_taint(s) for s in specs if not s.endswith("-")]
    removes = [parse_taint(s[:-1]) for s in specs if s.endswith("-")]
    old = node.setdefault("spec", {}).get("taints") or []
    # taint.go updateTaints: an added taint whose key and effect are there already is refused
    if not flags.get("overwrite"):
        there = [a["key"] for a in adds for o in old
                 if a["key"] == o.get("key") and a.get("effect") == o.get("effect")]
        if there:
            raise Exit(f"error: node {name} already has {','.join(there)} taint(s) with same "
                       f"effect(s) and --overwrite is false\n")
    # utils.go reorganizeTaints: the new ones, then the old ones not matched (MatchTaint:
    # key and effect), then the removals (key and effect; key alone: every effect)
    new = list(adds) + [o for o in old if not any(
        a["key"] == o.get("key") and a.get("effect") == o.get("effect") for a in adds)]
    added = len(old) != len(new)
    errors, removed = [], False
    for r in removes:
        keep = [t for t in new if not (t.get("key") == r["key"] and (
            "effect" not in r or t.get("effect") == r["effect"]))]
        removed = len(keep) != len(new)
        new = keep
        if not removed:
            errors.append(f'taint "{to_string(r)}" not found')
    if errors:
        raise Exit("error: " + errors[0] + "\n" if len(errors) == 1 else
                   "error: [" + ", ".join(errors) + "]\n")
    operation = "modified" if (added and removed) or flags.get("overwrite") else \
        "tainted" if added else "untainted"
    if new:
        node["spec"]["taints"] = new
    else:
        node["spec"].pop("taints", None)
    save(state)
    return f"node/{name} {operation}\n"


def merge_conditions(old, patch):
    """Strategic merge of status.conditions (patchMergeKey: type), $patch: delete included."""
    out = [dict(c) for c in old]
    for item in patch:
        kind = item.get("type")
        at = next((i for i, c in enumerate(out) if c.get("type") == kind), None)
        if item.get("$patch") == "delete":
            if at is not None:
                del out[at]
        elif at is None:
            out.append({k: v for k, v in item.items() if not k.startswith("$")})
        else:
            out[at].update({k: v for k, v in item.items() if not k.startswith("$")})
    return out


def patch(state, words, flags):
    if len(words) != 2 or KINDS.get(words[0]) != "nodes":
        raise Exit("error: this stand-in patches one node\n")
    if flags.get("patch") and flags.get("patch-file"):
        raise Exit("error: cannot specify --patch and --patch-file together\n")
    if flags.get("patch-file"):
        try:
            with open(flags["patch-file"], "rb") as f:
                body = f.read()
        except OSError as exc:
            raise Exit(f"error: unable to read patch file: open {flags['patch-file']}: "
                       f"{exc.strerror.lower()}\n")
        log = os.environ.get("MLDIAG_FAKE_KUBECTL_LOG")
        if log:
            with open(log + ".patches", "ab") as f:
                f.write(body + b"\n")
    elif flags.get("patch"):
        body = flags["patch"].encode()
    else:
        raise Exit("error: must specify --patch or --patch-file containing the contents of the "
                   "patch\n")
    if flags.get("type", "strategic") != "strategic" or flags.get("subresource") != "status":
        raise Exit("error: this stand-in takes --subresource status --type strategic only\n")
    name = words[1]
    node = state["nodes"].get(name)
    if node is None:
        raise Exit(not_found("nodes", name))
    doc = json.loads(body)
    status = node.setdefault("status", {})
    before = json.dumps(node, sort_keys=True)
    for key, value in (doc.get("status") or {}).items():
        if key == "conditions":
            status["conditions"] = merge_conditions(status.get("conditions") or [], value)
        else:
            status[key] = value
    changed = json.dumps(node, sort_keys=True) != before
    save(state)
    return f"node/{name} patched" + ("" if changed else " (no change)") + "\n"


def save(state):
    path = os.environ["MLDIAG_FAKE_KUBECTL_STATE"]
    with open(path + ".new", "w") as f:
        json.dump(state, f, indent=1, sort_keys=True)
    os.replace(path + ".new", path)


def main(argv) -> int:
    log = os.environ.get("MLDIAG_FAKE_KUBECTL_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps(argv) + "\n")
    path = os.environ.get("MLDIAG_FAKE_KUBECTL_STATE")
    try:
        if not path:
            now = datetime.datetime.now()
            log_line = NO_SERVER_LOG.format(time=now.strftime("%m%d %H:%M:%S.%f"), pid=os.getpid())
            raise Exit(log_line * 5 + NO_SERVER)
        with open(path) as f:
            state = json.load(f)
        state.setdefault("pods", {})
        state.setdefault("nodes", {})
        words, flags = parse(argv)
        command, rest = (words[0], words[1:]) if words else ("", [])
        handler = {"get": get, "taint": taint, "patch": patch}.get(command)
        if handler is None:
            raise Exit(f'error: unknown command "{command}" for "kubectl"\n')
        sys.stdout.write(handler(state, rest, flags))
        return 0
    except Exit as exc:
        sys.stdout.write(exc.stdout)
        sys.stderr.write(exc.stderr)
        return exc.code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
