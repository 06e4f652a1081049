"""known_hosts lines read as OpenSSH reads them (sshd(8) SSH_KNOWN_HOSTS FILE FORMAT)."""

import base64

import paramiko
import pytest

from diagnostics.transport import knownhosts as kh


@pytest.fixture(scope="module")
def keys():
    return [_ed25519() for _ in range(3)]


def _ed25519():
    from cryptography.hazmat.primitives.asymmetric import ed25519
    from cryptography.hazmat.primitives import serialization
    raw = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    keytype, b64 = raw.decode().split()[:2]
    return paramiko.PKey.from_type_string(keytype, base64.b64decode(b64))


def line(host, key, marker=""):
    return f"{marker + ' ' if marker else ''}{host} {key.get_name()} {key.get_base64()}"


@pytest.mark.parametrize("patterns,name,expected", [
    ("a.example,b.example", "b.example", True),
    ("*.example", "A.EXAMPLE", True),
    ("n?", "n1", True),
    ("n?", "n10", False),
    ("*.example,!bad.example", "bad.example", False),
    ("[10.0.0.1]:2222", "[10.0.0.1]:2222", True),
    ("10.0.0.1", "[10.0.0.1]:2222", False),
    ("a+b", "aab", False),                      # not a regex
])
def test_host_patterns(patterns, name, expected):
    assert kh.match_host_patterns(patterns, name.lower()) is expected


def test_markers_are_parsed_not_fatal_and_bad_lines_skipped(keys):
    text = "\n".join([
        "# comment", "",
        line("h1", keys[0]),
        line("*", keys[1], "@revoked"),
        line("*.example", keys[2], "@cert-authority"),
        "@unknown-marker h1 ssh-ed25519 AAAA",
        "h2 ssh-ed25519 !!notbase64!!",
        "h3 only-two-fields",
    ])
    entries = kh.parse(text, "f")
    assert [(e.marker, e.hosts, e.where) for e in entries] == [
        (None, "h1", "f:3"), ("@revoked", "*", "f:4"), ("@cert-authority", "*.example", "f:5")]


def test_verdicts(keys):
    known = kh.KnownHosts(kh.parse("\n".join([
        line("h1", keys[0]), line("h1", keys[1], "@revoked"),
        line(kh.hashed_name("h2"), keys[1]),
        line("*.example", keys[2], "@cert-authority"),
    ]), "f"))
    assert known.verdict("h1", keys[0])[0] == "known"
    assert known.verdict("h1", keys[1])[0] == "revoked"          # revoked beats listed elsewhere
    assert known.verdict("h1", keys[2])[0] == "changed"
    assert known.verdict("h2", keys[1])[0] == "known"           # @revoked h1 covers h1 only
    assert known.verdict("H2", keys[1])[0] == "known"           # names compare lowercased
    assert known.verdict("h2", keys[2])[0] == "changed"
    verdict, entry = known.verdict("x.example", keys[0])
    assert verdict == "unknown" and entry.marker == "@cert-authority"
    assert known.verdict("nowhere", keys[0]) == ("unknown", None)
    assert known.key_types("h1") == ["ssh-ed25519"]


def test_hashed_name_matches_like_ssh_keygen():
    salt = b"s" * 20
    field = kh.hashed_name("[Host]:22", salt)
    entry = kh.Entry(None, field, "ssh-ed25519", b"", "f:1")
    assert entry.hashed and entry.matches("[host]:22") and not entry.matches("[host]:23")
