"""Errors that name the right layer (issue 11 items 12, 13): a port that answers without an SSH
banner, and a host mldiag has no key for (that one against the lab's sshd:
tests/integration/test_hostkeys.py::test_no_key_to_offer_is_auth_with_a_hint)."""

import json
import socket
import threading

from tests.programs import mldiag


def silent_listener():
    """A TCP port that accepts and never says anything (a wrong port, a stuck service)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held = []

    def accept():
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return
    threading.Thread(target=accept, daemon=True).start()
    return server, held


def test_a_port_without_an_ssh_banner_is_named_so_and_no_library_traceback_shows(tmp_path):
    server, held = silent_listener()
    port = server.getsockname()[1]
    try:
        (tmp_path / "hosts.yaml").write_text(
            f"hosts:\n  quiet: {{address: 127.0.0.1, port: {port}, connect_timeout: 2}}\n"
            "  here: {local: true}\n")
        table = mldiag("ping", "-H", "quiet,here", cwd=tmp_path, timeout=60)
        as_json = mldiag("ping", "-H", "quiet", "--json", cwd=tmp_path, timeout=60)
    finally:
        server.close()
        for conn in held:
            conn.close()
    assert held, "the client never connected"
    assert table.returncode == 3, table
    assert f"127.0.0.1:{port} answered but is not an SSH server (no banner in 2 s)" in table.stdout
    assert "here" in table.stdout and "1 ok" in table.stdout
    assert table.stderr == "" and "Traceback" not in table.stdout     # no paramiko log, no traceback
    error = json.loads(as_json.stdout)[0]["error"]
    assert error["layer"] == "unreachable"
    assert error["message"] == f"127.0.0.1:{port} answered but is not an SSH server (no banner in 2 s)"
