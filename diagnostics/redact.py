"""Secrets never leave a result: applied to every document before anything shows or saves it.

Two kinds of secret are masked wherever they appear in a result (summary, findings, data, log,
error message, traceback, stderr — and the keys of data too):
- values we know: the target's ``env:`` values whose name says secret (token, secret, key,
  password, passwd, credential), as hosts.yaml gave them to the diagnostic;
- values we recognise: private key blocks, ``NAME=value`` / ``"NAME": "value"`` pairs whose
  name says secret (what ``env``, ``printenv`` or a dumped config print), credentials inside
  URLs, and the token formats of the services ML teams use (Hugging Face, GitHub, OpenAI,
  AWS access keys, Slack, W&B keys printed by name).

It is a safety net, not a licence: diagnostics still redact at the source (env-report does).
"""

import re
from typing import Any, Dict, Iterable, Optional, Tuple

REDACTED = "<redacted>"
NOT_SECRET = frozenset(["TOKENIZERS_PARALLELISM", "KEYBOARD", "KEYMAP", "HOSTKEY", "MONKEY"])
# a value this short is more likely a flag than a secret, and masking it would mangle text
MIN_SECRET_LEN = 4

_NAME = r"[A-Za-z][A-Za-z0-9_.-]*"
_VALUE = r"[^\s\"',;}&]{%d,}" % MIN_SECRET_LEN
_PAIRS = (
    re.compile(r"(?<![A-Za-z0-9_.])(%s)(=)(%s)" % (_NAME, _VALUE)),           # NAME=value anywhere
    re.compile(r"(?m)^(\s*)(%s)(\s*:\s*)(%s)" % (_NAME, _VALUE)),             # NAME: value, line start
    re.compile(r"(\")(%s)(\"\s*:\s*\")(%s)" % (_NAME, _VALUE)),                # "NAME": "value" (JSON)
)
_PATTERNS = (
    re.compile(r"-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY-----.*?(?:-----END \1PRIVATE KEY-----|\Z)", re.S),
    re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^/\s:@]+:)([^/\s@]+)(@)"),  # scheme://user:PASSWORD@host
    re.compile(r"\bhf_[A-Za-z0-9]{30,}\b"),                       # Hugging Face
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}\b"),                 # GitHub
    re.compile(r"\bgithub_pat_[A-Za-z0-9_]{40,}\b"),
    re.compile(r"\bsk-(?:proj-)?[A-Za-z0-9_-]{20,}\b"),            # OpenAI-style
    re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),                  # AWS access key id
    re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}\b"),               # Slack
)
# a name is secret when one of its parts (split at _ . -) is one of these or ends with one...
_SECRET_PARTS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "CREDENTIAL", "CREDENTIALS")
# ...unless its last part says it names something else (a policy, a path, a size, a count)
_NOT_SECRET_LAST = ("POLICY", "FILE", "PATH", "DIR", "TYPE", "NAME", "ID", "LEN", "LENGTH", "SIZE",
                    "COUNT", "HEADS", "DIM", "CHECKING", "ALGORITHMS", "PARALLELISM", "ERROR",
                    "EXCEPTION", "WARNING")


def is_secret_name(name: str) -> bool:
    """HF_TOKEN, DB_PASSWORD, WANDB_API_KEY, aws_secret_access_key: yes. TOKENIZERS_PARALLELISM,
    host_key_policy, num_key_value_heads, tokenizer_path, KeyError: no."""
    upper = name.upper()
    if upper in NOT_SECRET:
        return False
    parts = [p for p in re.split(r"[_.-]", upper) if p]
    if not parts or parts[-1] in _NOT_SECRET_LAST:
        return False
    return any(part.endswith(_SECRET_PARTS) and not part.endswith("HOSTKEY") for part in parts)


def known_secrets(env: Dict[str, str]) -> Tuple[str, ...]:
    """The values of ``env`` whose names say secret, longest first (so none masks part of another)."""
    values = {v for k, v in env.items() if is_secret_name(k) and len(v) >= MIN_SECRET_LEN}
    return tuple(sorted(values, key=len, reverse=True))


_NOT_A_SECRET_VALUE = re.compile(r"(?i)[0-9.]+|true|false|none|null|yes|no|<redacted>")


def _mask_pair(match: "re.Match") -> str:
    *before, name, sep, value = match.groups()
    if not is_secret_name(name) or _NOT_A_SECRET_VALUE.fullmatch(value):
        return match.group(0)
    return "".join(before) + name + sep + REDACTED


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    for value in secrets:
        if value in text:
            text = text.replace(value, REDACTED)
    if not any(ch in text for ch in "-=:_@kK"):   # fast path: nothing any pattern could match
        return text
    text = _PATTERNS[0].sub(REDACTED, text)
    for pair in _PAIRS:
        text = pair.sub(_mask_pair, text)
    text = _PATTERNS[1].sub(lambda m: m.group(1) + REDACTED + m.group(3), text)
    for pattern in _PATTERNS[2:]:
        text = pattern.sub(REDACTED, text)
    return text


def redact(value: Any, secrets: Iterable[str] = ()) -> Any:
    """``value`` (a result document or any part of it) with every secret masked; a new object."""
    secrets = tuple(secrets)
    if isinstance(value, str):
        return redact_text(value, secrets)
    if isinstance(value, dict):
        return {(redact_text(k, secrets) if isinstance(k, str) else k): redact(v, secrets)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v, secrets) for v in value]
    return value


def redact_document(doc: Dict[str, Any], env: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    return redact(doc, known_secrets(env or {}))
