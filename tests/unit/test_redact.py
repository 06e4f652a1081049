"""Secrets are masked in result documents (diagnostics/redact.py)."""

import json

import pytest

from diagnostics import redact
from diagnostics.results import Result

HF = "hf_" + "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3z"
PEM = ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\n"
       "AAAAAAAAABAAAAMwAAAAtzc2gtZW\n-----END OPENSSH PRIVATE KEY-----")


def test_known_secrets_are_env_values_with_secret_names_longest_first():
    env = {"HF_TOKEN": "abcd1234", "DB_PASSWORD": "pw-longer-one", "HF_HOME": "/dev/shm/hf",
           "TOKENIZERS_PARALLELISM": "false", "API_KEY": "x"}
    assert redact.known_secrets(env) == ("pw-longer-one", "abcd1234")


@pytest.mark.parametrize("text, expected", [
    ("token is s3cr3t-value here", "token is <redacted> here"),
    (f"export HF_TOKEN={HF}", "export HF_TOKEN=<redacted>"),
    ("WANDB_API_KEY=0123456789abcdef0123", "WANDB_API_KEY=<redacted>"),
    ('{"aws_secret_access_key": "wJalrXUtnFEMI/K7MDENG"}', '{"aws_secret_access_key": "<redacted>"}'),
    ("password: hunter22", "password: <redacted>"),
    (f"key file:\n{PEM}\nend", "key file:\n<redacted>\nend"),
    ("https://alice:pa55word@hub.example.org/x", "https://alice:<redacted>@hub.example.org/x"),
    (f"login with {HF}", "login with <redacted>"),
    ("ghp_" + "A" * 36, "<redacted>"),
    ("AKIAIOSFODNN7EXAMPLE used", "<redacted> used"),
    ("xoxb-1234567890-abcdefghij", "<redacted>"),
    # not secrets: left exactly as they were
    ("TOKENIZERS_PARALLELISM=false", "TOKENIZERS_PARALLELISM=false"),
    ("KeyError: 'model.layers.0'", "KeyError: 'model.layers.0'"),
    ("num_key_value_heads=8192 hidden_size=4096", "num_key_value_heads=8192 hidden_size=4096"),
    ("KeyError: missing_weight", "KeyError: missing_weight"),
    ("tokenizer_path=/models/llama/tok", "tokenizer_path=/models/llama/tok"),
    ("use_auth_token: true", "use_auth_token: true"),
    ("hostkey: host key for [h]:22 is not known (or set host_key_policy: accept-new for it)",
     "hostkey: host key for [h]:22 is not known (or set host_key_policy: accept-new for it)"),
    ("error: key: value pairs expected", "error: key: value pairs expected"),
    ("auth: api_key: abcdef123", "auth: api_key: abcdef123"),   # mid-line colon: prose, not config
    ("  api_key: abcdef123", "  api_key: <redacted>"),           # a config line
    ("--hf-token=abcdef123 --model x", "--hf-token=<redacted> --model x"),
    ("sk-short", "sk-short"),
    ("https://hub.example.org/x", "https://hub.example.org/x"),
])
def test_redact_text(text, expected):
    # (a known secret value is masked wherever it stands, whatever its name)
    assert redact.redact_text(text, ["s3cr3t-value"]) == expected


def test_a_whole_document_is_redacted_everywhere_and_keeps_its_shape():
    secret = "tok-9f8e7d6c5b4a"
    r = Result(diagnostic="run-script", target="t", status="fail", summary=f"exit 1 ({secret})",
               data={"stdout": f"HF_TOKEN={secret}\n", "nested": [{secret: 1, "k": PEM}]},
               log=[{"level": "WARNING", "source": "x", "message": f"using {secret}"}])
    r.findings = []
    doc = redact.redact_document(r.to_dict(), {"MY_TOKEN": secret, "HOME": "/root"})
    text = json.dumps(doc)
    assert secret not in text and "PRIVATE KEY" not in text
    assert doc["summary"] == "exit 1 (<redacted>)"
    assert doc["data"]["nested"] == [{"<redacted>": 1, "k": "<redacted>"}]
    assert doc["status"] == "fail" and doc["target"] == "t"
    assert Result.from_dict(doc).to_dict() == doc


def test_short_values_are_not_treated_as_secrets():
    # masking "1" would turn every digit of a report into <redacted>
    assert redact.known_secrets({"USE_TOKEN": "1"}) == ()
    assert redact.redact_document({"summary": "1 of 8"}, {"USE_TOKEN": "1"}) == {"summary": "1 of 8"}


def test_internal_error_report_and_its_traceback_file_hold_no_secret():
    from diagnostics import cli
    import os
    import re as re_
    try:
        raise RuntimeError(f"request failed with HF_TOKEN={HF}")
    except RuntimeError as exc:
        message = cli.internal_error(exc)
    assert HF not in message and "HF_TOKEN=<redacted>" in message
    path = re_.search(r"full traceback in (\S+)", message).group(1)
    try:
        text = open(path).read()
        assert "Traceback (most recent call last)" in text and "RuntimeError" in text
        assert HF not in text
        assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    finally:
        os.unlink(path)
