"""A loopback stand-in for the Kubernetes API server, just enough for the real ``kubectl`` to run
the commands tests/fakes/kubectl.py mimics (``get pods|nodes``, ``taint``, ``patch --subresource
status``), so that a test can hold the two side by side: same cluster, same commands, same
output (tests/unit/test_node_check_taint.py). Plain HTTP on 127.0.0.1, no authentication.

The server side follows the API server where kubectl reads it: legacy discovery (``/api``,
``/apis``, ``/api/v1``), a ``Status`` of reason NotFound with apimachinery's message
(``NewNotFound``: ``pods "x" not found``), the namespace looked up after a namespaced object is
not found (kubectl's builder asks), and strategic merge patches as kubectl sends them: a
taint list replaced whole (``spec.taints`` has no merge strategy), ``status.conditions`` merged
on ``type`` with ``$patch: delete``. The cluster is tests/fakes/kubectl.py's state document.

Standard library only.
"""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

RESOURCES = {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "v1", "resources": [
    {"name": "namespaces", "singularName": "namespace", "namespaced": False, "kind": "Namespace",
     "verbs": ["get", "list"], "shortNames": ["ns"]},
    {"name": "nodes", "singularName": "node", "namespaced": False, "kind": "Node",
     "verbs": ["get", "list", "patch", "update"], "shortNames": ["no"]},
    {"name": "nodes/status", "singularName": "", "namespaced": False, "kind": "Node",
     "verbs": ["get", "patch", "update"]},
    {"name": "pods", "singularName": "pod", "namespaced": True, "kind": "Pod",
     "verbs": ["get", "list"], "shortNames": ["po"]}]}


def merge(old, patch):
    """A strategic merge patch of a Node as kubectl taint/patch send one (see the docstring)."""
    if not isinstance(patch, dict) or not isinstance(old, dict):
        return patch
    out = dict(old)
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        if value is None:
            out.pop(key, None)
        elif key == "conditions" and isinstance(value, list):
            conditions = [dict(c) for c in out.get(key, [])]
            for item in value:
                at = next((i for i, c in enumerate(conditions) if c.get("type") == item.get("type")),
                          None)
                fields = {k: v for k, v in item.items() if not k.startswith("$")}
                if item.get("$patch") == "delete":
                    if at is not None:
                        del conditions[at]
                elif at is None:
                    conditions.append(fields)
                else:
                    conditions[at].update(fields)
            out[key] = conditions
        elif isinstance(value, dict):
            out[key] = merge(out.get(key, {}), value)
        else:
            out[key] = value
    return out


def serve(state):
    """Serve ``state`` ({"pods": {"NS/NAME": Pod}, "nodes": {"NAME": Node}}, changed in place)
    on 127.0.0.1; the server (``shutdown()`` it) and its URL."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def send(self, code, obj):
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def not_found(self, resource, name):
            self.send(404, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                            "status": "Failure", "message": f'{resource} "{name}" not found',
                            "reason": "NotFound", "details": {"name": name, "kind": resource},
                            "code": 404})

        def do_GET(self):
            parts = self.path.split("?")[0].strip("/").split("/")
            if parts == ["api"]:
                return self.send(200, {"kind": "APIVersions", "versions": ["v1"],
                                       "serverAddressByClientCIDRs": [
                                           {"clientCIDR": "0.0.0.0/0",
                                            "serverAddress": "127.0.0.1"}]})
            if parts == ["apis"]:
                return self.send(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": []})
            if parts == ["api", "v1"]:
                return self.send(200, RESOURCES)
            if parts[:3] == ["api", "v1", "nodes"] and len(parts) in (4, 5):
                node = state["nodes"].get(parts[3])
                return self.send(200, node) if node else self.not_found("nodes", parts[3])
            if parts[:3] == ["api", "v1", "namespaces"] and len(parts) == 4:
                if any(key.split("/")[0] == parts[3] for key in state["pods"]):
                    return self.send(200, {"apiVersion": "v1", "kind": "Namespace",
                                           "metadata": {"name": parts[3]}})
                return self.not_found("namespaces", parts[3])
            if parts[:3] == ["api", "v1", "namespaces"] and len(parts) == 6 and parts[4] == "pods":
                pod = state["pods"].get(f"{parts[3]}/{parts[5]}")
                return self.send(200, pod) if pod else self.not_found("pods", parts[5])
            self.send(404, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                            "status": "Failure", "reason": "NotFound", "code": 404,
                            "message": "the server could not find the requested resource"})

        def do_PATCH(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            parts = self.path.split("?")[0].strip("/").split("/")
            node = state["nodes"].get(parts[3]) if parts[:3] == ["api", "v1", "nodes"] else None
            if node is None:
                return self.not_found("nodes", parts[3] if len(parts) > 3 else "")
            state["nodes"][parts[3]] = merge(node, body)
            self.send(200, state["nodes"][parts[3]])

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"
