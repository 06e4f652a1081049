"""Host keys are verified by default (DESIGN.md §3.6): known_hosts from ssh_config's
UserKnownHostsFile (hashed entries included), unknown or changed keys refused loudly,
`host_key_policy: accept-new` records the key. The ssh_config here `Include`s the lab's."""

import os
import subprocess

import pytest

from diagnostics.engine import bundle, runner
from diagnostics.inventory import topology


@pytest.fixture
def ssh_setup(lab, tmp_path):
    """An ssh_config with its own (empty) known_hosts for 127.0.0.2, including the lab's."""
    kh = tmp_path / "known_hosts"
    kh.write_text("")
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"""Host fresh
  HostName {lab.main.address}
  Port {lab.main.port}
  User mlsh
  IdentityFile {lab.identity}
  UserKnownHostsFile {kh}
  StrictHostKeyChecking yes

Include {lab.ssh_config}
""")
    old = os.environ.get("MLDIAG_SSH_CONFIG")
    os.environ["MLDIAG_SSH_CONFIG"] = str(cfg)
    yield kh
    if old is None:
        os.environ.pop("MLDIAG_SSH_CONFIG", None)
    else:
        os.environ["MLDIAG_SSH_CONFIG"] = old


def ping(lab, yaml_text, name):
    topo = topology.load(str(lab.hosts_yaml(yaml_text)))
    return runner.run_many([topo.targets[name]], bundle.script_job("ping"))[0]


def test_unknown_host_key_is_refused_with_a_way_to_trust_it(lab, ssh_setup):
    r = ping(lab, "hosts:\n  fresh: {}\n", "fresh")
    assert r.status == "error" and r.error.layer == "hostkey"
    assert "is not known" in r.error.message
    assert f"ssh-keyscan -p {lab.main.port} {lab.main.address} >> {ssh_setup}" in r.error.message
    assert "accept-new" in r.error.message
    assert ssh_setup.read_text() == ""


def test_accept_new_records_the_key_then_strict_passes(lab, ssh_setup):
    r = ping(lab, "hosts:\n  fresh: {host_key_policy: accept-new}\n", "fresh")
    assert r.status == "ok", r.to_dict()
    line = ssh_setup.read_text().strip()
    assert line.startswith(f"[{lab.main.address}]:{lab.main.port} ssh-ed25519 ")
    # OpenSSH itself agrees with what we wrote
    out = subprocess.run(["ssh", "-F", os.environ["MLDIAG_SSH_CONFIG"], "fresh", "true"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert ping(lab, "hosts:\n  fresh: {host_key_policy: strict}\n", "fresh").status == "ok"


def test_changed_host_key_is_refused_loudly(lab, ssh_setup, tmp_path):
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    pub = other.with_suffix(".pub").read_text().split()
    ssh_setup.write_text(f"[{lab.main.address}]:{lab.main.port} {pub[0]} {pub[1]}\n")
    r = ping(lab, "hosts:\n  fresh: {host_key_policy: accept-new}\n", "fresh")
    assert r.status == "error" and r.error.layer == "hostkey"
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in r.error.message
    assert f"ssh-keygen -R '[{lab.main.address}]:{lab.main.port}'" in r.error.message


def test_hashed_known_hosts_entries_are_honoured(lab):
    """The lab's known_hosts holds only hashed (|1|...) entries."""
    assert all(line.startswith("|1|") for line in lab.known_hosts.read_text().splitlines() if line)
    r = ping(lab, "hosts:\n  main: {}\n", "main")
    assert r.status == "ok", r.to_dict()


def test_authentication_refused_is_auth(lab, tmp_path):
    stranger = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    r = ping(lab, f"hosts:\n  main: {{identity_file: {stranger}}}\n", "main")
    assert r.status == "error" and r.error.layer == "auth"
    assert "authentication refused for mlsh@" in r.error.message


def test_ssh_config_strict_host_key_checking_accept_new_is_honoured(lab, ssh_setup, tmp_path):
    """`StrictHostKeyChecking accept-new` in ssh_config (no host_key_policy in hosts.yaml)
    records the new key in that config's UserKnownHostsFile, as OpenSSH does."""
    cfg = tmp_path / "ssh_config_accept_new"
    with open(os.environ["MLDIAG_SSH_CONFIG"]) as f:
        cfg.write_text(f.read().replace("StrictHostKeyChecking yes", "StrictHostKeyChecking accept-new", 1))
    os.environ["MLDIAG_SSH_CONFIG"] = str(cfg)        # ssh_setup puts the old value back
    r = ping(lab, "hosts:\n  fresh: {}\n", "fresh")
    assert r.status == "ok", r.to_dict()
    assert ssh_setup.read_text().startswith(f"[{lab.main.address}]:{lab.main.port} ssh-ed25519 ")


# --- known_hosts markers and hashing (issue 10 items 15, 16) ---

def _server_key(lab):
    keytype, key = lab.main.host_key_pub.split()[:2]
    return keytype, key


def _other_key(tmp_path, name="other"):
    path = tmp_path / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().split()[:2]


def test_a_revoked_server_key_is_refused_even_under_accept_new(lab, ssh_setup):
    keytype, key = _server_key(lab)
    text = f"@revoked * {keytype} {key}\n"
    ssh_setup.write_text(text)
    r = ping(lab, "hosts:\n  fresh: {host_key_policy: accept-new}\n", "fresh")
    assert r.status == "error" and r.error.layer == "hostkey", r.to_dict()
    assert "REVOKED" in r.error.message and f"{ssh_setup}:1" in r.error.message
    assert ssh_setup.read_text() == text                 # nothing recorded
    # listed as trusted too: the revocation still wins, as in OpenSSH
    ssh_setup.write_text(f"[{lab.main.address}]:{lab.main.port} {keytype} {key}\n" + text)
    r = ping(lab, "hosts:\n  fresh: {}\n", "fresh")
    assert r.status == "error" and r.error.layer == "hostkey" and "REVOKED" in r.error.message
    out = subprocess.run(["ssh", "-F", os.environ["MLDIAG_SSH_CONFIG"], "fresh", "true"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode != 0 and "REVOKED" in out.stderr   # OpenSSH agrees


def test_another_revoked_key_and_cert_authority_lines_do_not_stop_a_known_host(lab, ssh_setup, tmp_path):
    keytype, key = _server_key(lab)
    other_type, other = _other_key(tmp_path)
    ca_type, ca = _other_key(tmp_path, "ca")
    ssh_setup.write_text(
        f"@revoked * {other_type} {other}\n"
        f"@cert-authority *.example.org,{lab.main.address} {ca_type} {ca}\n"
        f"[{lab.main.address}]:{lab.main.port} {keytype} {key}\n")
    r = ping(lab, "hosts:\n  fresh: {}\n", "fresh")
    assert r.status == "ok", r.to_dict()
    out = subprocess.run(["ssh", "-F", os.environ["MLDIAG_SSH_CONFIG"], "fresh", "true"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr                   # OpenSSH agrees


def test_a_host_covered_only_by_a_cert_authority_is_unknown_with_a_note(lab, ssh_setup, tmp_path):
    ca_type, ca = _other_key(tmp_path, "ca")
    ssh_setup.write_text(f"@cert-authority [{lab.main.address}]:* {ca_type} {ca}\n")
    r = ping(lab, "hosts:\n  fresh: {}\n", "fresh")
    assert r.status == "error" and r.error.layer == "hostkey", r.to_dict()
    assert "is not known" in r.error.message and "@cert-authority" in r.error.message
    assert f"{ssh_setup}:1" in r.error.message


def _ssh_keygen_finds(lab, path):
    name = f"[{lab.main.address}]:{lab.main.port}"
    out = subprocess.run(["ssh-keygen", "-F", name, "-f", str(path)], capture_output=True, text=True)
    return out.returncode == 0 and _server_key(lab)[1] in out.stdout


def test_accept_new_writes_a_hashed_entry_into_a_hashed_file(lab, ssh_setup):
    hashed = [line for line in lab.known_hosts.read_text().splitlines()
              if line.startswith("|1|")][0]
    # a hashed file, for another host, without its last newline
    ssh_setup.write_text("|1|c2FsdHNhbHRzYWx0c2FsdHNhbHQ=|" + hashed.split("|")[3])
    r = ping(lab, "hosts:\n  fresh: {host_key_policy: accept-new}\n", "fresh")
    assert r.status == "ok", r.to_dict()
    lines = ssh_setup.read_text().splitlines()
    assert len(lines) == 2 and lines[1].startswith("|1|"), lines
    assert lab.main.address not in ssh_setup.read_text()
    assert _ssh_keygen_finds(lab, ssh_setup)
    assert ping(lab, "hosts:\n  fresh: {host_key_policy: strict}\n", "fresh").status == "ok"


def test_accept_new_hashes_when_ssh_config_says_hash_known_hosts(lab, ssh_setup, tmp_path):
    cfg = tmp_path / "ssh_config_hash"
    with open(os.environ["MLDIAG_SSH_CONFIG"]) as f:
        cfg.write_text(f.read().replace("StrictHostKeyChecking yes",
                                        "StrictHostKeyChecking accept-new\n  HashKnownHosts yes", 1))
    os.environ["MLDIAG_SSH_CONFIG"] = str(cfg)        # ssh_setup puts the old value back
    r = ping(lab, "hosts:\n  fresh: {}\n", "fresh")
    assert r.status == "ok", r.to_dict()
    line = ssh_setup.read_text()
    assert line.startswith("|1|") and lab.main.address not in line
    assert _ssh_keygen_finds(lab, ssh_setup)


def test_accept_new_never_writes_through_a_symlinked_known_hosts(lab, ssh_setup, tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("")
    ssh_setup.unlink()
    ssh_setup.symlink_to(target)
    r = ping(lab, "hosts:\n  fresh: {host_key_policy: accept-new}\n", "fresh")
    assert r.status == "error" and r.error.layer == "hostkey", r.to_dict()
    assert "symlink" in r.error.message
    assert target.read_text() == ""


def test_no_key_to_offer_is_auth_with_a_hint(lab, tmp_path):
    """No identity file exists and no agent runs: paramiko's "No authentication methods
    available" is the `auth` layer with the ways to fix it (issue 11 item 13), not `unreachable`."""
    cfg = tmp_path / "ssh_config_no_key"
    cfg.write_text(f"Host nokey\n  HostName {lab.main.address}\n  Port {lab.main.port}\n"
                   f"  User mlsh\n  IdentityFile {tmp_path / 'no-such-key'}\n"
                   f"  UserKnownHostsFile {lab.known_hosts}\n  StrictHostKeyChecking yes\n")
    old = os.environ.get("MLDIAG_SSH_CONFIG")
    os.environ["MLDIAG_SSH_CONFIG"] = str(cfg)
    agent = os.environ.pop("SSH_AUTH_SOCK", None)
    try:
        r = ping(lab, "hosts:\n  nokey: {}\n", "nokey")
    finally:
        if old is None:
            os.environ.pop("MLDIAG_SSH_CONFIG", None)
        else:
            os.environ["MLDIAG_SSH_CONFIG"] = old
        if agent is not None:
            os.environ["SSH_AUTH_SOCK"] = agent
    assert r.status == "error" and r.error.layer == "auth", r.to_dict()
    assert r.error.message.startswith("no key to offer mlsh@"), r.error.message
    assert "identity_file" in r.error.message and "ssh-agent" in r.error.message
    assert "ssh-copy-id" in r.error.message
