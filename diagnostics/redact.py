"""Secrets never leave a result: applied to every document before anything shows or saves it.

Two kinds of secret are masked wherever they appear in a result (summary, findings, data, log,
error message, traceback, stderr — and the keys of data too):
- values we know: the target's ``env:`` values whose name says secret (token, secret, key,
  password, passwd, passphrase, credential, authorization), as hosts.yaml gave them to the
  diagnostic;
- values we recognise: private key blocks; credentials inside URLs; a value given to a name that
  says secret, in the shapes ``env``, shells, config files and Python print (``NAME=value``,
  ``NAME = "value"``, ``aws_secret_access_key = …``, ``{'NAME': 'value'}``, ``"NAME": "value"``,
  ``NAME: value`` at a line start, ``--name value``, ``Authorization: Bearer …``); and the token
  formats of the services ML teams use (Hugging Face, GitHub, GitLab, OpenAI/Anthropic, Stripe,
  AWS access key ids, Slack, Google API keys, JWTs, PyPI, npm).

Every pattern runs in linear time, whatever a target prints: each one starts only where its
first character cannot continue a longer run of the same class (a negative lookbehind), every
repetition before a required character is bounded, and a secret's value ends the pattern, so a
match never backtracks through it. A name is matched first and its value read only when the
name says secret, so ``a=a=a=…`` costs one short match per ``=``.

It is a safety net, not a licence: diagnostics still redact at the source (env-report does).
"""

import re
from typing import Any, Dict, Iterable, List, Optional, Tuple

from .lean_imports import LazyPattern

# Each pattern below is compiled when first used (LazyPattern): compiling all 18 cost ~3.6 ms at
# every start, and most texts never reach one (each waits for its needle, see redact_text).

REDACTED = "<redacted>"
NOT_SECRET = frozenset(["MONKEY", "TURNKEY"])   # one-part names that end with KEY
# a value this short is more likely a flag than a secret, and masking it would mangle text
MIN_SECRET_LEN = 4

# A name says secret when one of its parts (split at _ . -) ends with one of these...
_SECRET_PARTS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL",
                 "CREDENTIALS", "AUTHORIZATION")
# ...or its last part ends with KEY: a key elsewhere in a name is a tensor or a setting
# (key_states, past_key_values, query_key_value, host_key_policy), not a secret
_SECRET_LAST_PARTS = ("KEY",)
# ...unless its last part says it names something else (a policy, a path, a size, a count)
_NOT_SECRET_LAST = ("POLICY", "FILE", "PATH", "DIR", "TYPE", "NAME", "ID", "IDS", "LEN", "LENGTH",
                    "SIZE", "COUNT", "DIM", "ERROR", "EXCEPTION", "WARNING", "STDIN")
# a tokenizer's special tokens (eos_token='</s>') are vocabulary, printed by every ML tool
_SPECIAL_TOKEN_ROLES = ("BOS", "EOS", "PAD", "UNK", "SEP", "CLS", "MASK")


def is_secret_name(name: str) -> bool:
    """HF_TOKEN, DB_PASSWORD, WANDB_API_KEY, aws_secret_access_key: yes. TOKENIZERS_PARALLELISM,
    host_key_policy, num_key_value_heads, tokenizer_path, KeyError, eos_token: no."""
    upper = name.upper()
    if upper in NOT_SECRET:
        return False
    parts = [p for p in re.split(r"[_.-]", upper) if p]
    if not parts or parts[-1] in _NOT_SECRET_LAST:
        return False
    if parts[-1] == "TOKEN" and len(parts) > 1 and parts[-2] in _SPECIAL_TOKEN_ROLES:
        return False
    if parts[-1].endswith(_SECRET_LAST_PARTS) and not parts[-1].endswith("HOSTKEY"):
        return True
    return any(part.endswith(_SECRET_PARTS) for part in parts)


def known_secrets(env: Dict[str, str]) -> Tuple[str, ...]:
    """The values of ``env`` whose names say secret, longest first (so none masks part of
    another)."""
    values = {v for k, v in env.items() if is_secret_name(k) and len(v) >= MIN_SECRET_LEN}
    return tuple(sorted(values, key=len, reverse=True))


# --- a value given to a name ------------------------------------------------------------------
# Bounded, and led by a lookbehind, so a long run of name characters costs one short attempt.
_NAME = r"[A-Za-z_][A-Za-z0-9_.-]{0,127}"
_SP = r"[ \t]{0,8}"
_HEAD = LazyPattern(r"""
    (?P<q>\\?["'])(?P<quoted>%(name)s)(?P=q)\]?%(sp)s(?:=>?|:)%(sp)s   # 'NAME': "NAME"= ['NAME'] =
  | (?<![\w.-])(?P<header>(?i:(?:proxy-)?authorization))%(sp)s:%(sp)s  # Authorization: mid-line too
  | (?<![\w.-])(?P<assigned>-{0,2}%(name)s)%(sp)s=%(sp)s             # NAME=v, NAME = v, --flag=v
  | (?m:^)[ \t>#*+-]{0,16}(?P<line>%(name)s)%(sp)s:%(sp)s               # NAME: v at a line start
  | (?<![\w.-])(?P<colon>%(name)s)%(sp)s:%(sp)s(?=b?\\?["'])            # NAME: 'v' anywhere
  | (?<![\w.-])(?P<flag>--?%(name)s)[ \t]{1,8}(?=[^\s-])                # --flag v
""" % {"name": _NAME, "sp": _SP}, re.X)
# The value ends the match, so these greedy runs never backtrack. A bare value stops where
# shells, URLs and reprs end one; it never starts a nested structure ({, [, ( stay readable, and
# the pairs inside them are found on their own), nor with = (so `token == x` compares).
_VALUE = LazyPattern(r"""
    b?"(?P<dq>(?:[^"\\\n]|\\.)+)                  # "value", b"value" (JSON, Python)
  | b?'(?P<sq>(?:[^'\\\n]|\\.)+)                  # 'value' (Python repr, shell)
  | \\"(?P<edq>[^"\\\n]+)                          # \"value\" (JSON inside a JSON string)
  | (?:(?i:bearer|basic|token|digest|negotiate)[ \t]{1,8}(?=\S))?   # an auth scheme stays readable
    (?P<bare>[^\s"',;}&=({\[][^\s"',;}&]*)
""", re.X)
# values that are settings, placeholders or already masked, not secrets
_NOT_A_SECRET_VALUE = LazyPattern(
    r"(?i)[0-9.]{1,6}|true|false|none|null|yes|no|<[^<>\s]{0,40}>|\$\{?\w+\}?|\*+")
_PAIR_NEEDLES = ("token", "secret", "pass", "key", "credential", "authorization")


def _mask_pairs(text: str) -> str:
    pieces: List[str] = []
    done = 0   # text before this is copied (or masked) already
    for head in _HEAD.finditer(text):
        if head.start() < done:
            continue   # a name inside a value just masked
        name = head["quoted"] or head["assigned"] or head["line"] or head["colon"] or head["flag"]
        if head["header"] is None and not is_secret_name(name):
            continue
        value = _VALUE.match(text, head.end())
        if value is None:
            continue
        kind = value.lastgroup
        body = value[kind]
        if (kind == "bare" and len(body) < MIN_SECRET_LEN) or _NOT_A_SECRET_VALUE.fullmatch(body):
            continue
        pieces += [text[done:value.start(kind)], REDACTED]
        done = value.end(kind)
    pieces.append(text[done:])
    return "".join(pieces)


# --- values recognised by their shape ---------------------------------------------------------
# (a lower-case string every match contains, so the pattern is skipped when it is absent;
#  the pattern; what replaces a match)
_SHAPES = (
    ("private key", LazyPattern(r"-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----.*?"
                               r"(?:-----END[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----|\Z)", re.S),
     REDACTED),
    ("://", LazyPattern(r"(?i)(?<![a-z0-9+.-])([a-z][a-z0-9+.-]{0,31}://[^/\s:@]{0,256}:)"
                       r"[^/\s@]{1,1024}(?=@)"),                         # scheme://user:PASSWORD@
     r"\g<1>" + REDACTED),
)
_TOKENS = (
    ("hf_", LazyPattern(r"(?<![A-Za-z0-9])hf_[A-Za-z0-9]{30,}")),      # Hugging Face, also MY_hf_…
    ("gh", LazyPattern(r"(?<![A-Za-z0-9_])gh[pousr]_[A-Za-z0-9]{30,}")),     # GitHub
    ("github_pat_", LazyPattern(r"(?<![A-Za-z0-9_])github_pat_[A-Za-z0-9_]{40,}")),
    ("glpat-", LazyPattern(r"(?<![A-Za-z0-9_-])glpat-[A-Za-z0-9_-]{20,}")),   # GitLab
    ("sk-", LazyPattern(r"(?<![A-Za-z0-9_-])sk-[A-Za-z0-9_-]{20,}")),        # OpenAI, Anthropic
    ("k_", LazyPattern(r"(?<![A-Za-z0-9_])[rs]k_(?:live|test)_[A-Za-z0-9]{16,}")),   # Stripe
    ("ia", LazyPattern(r"(?<![A-Za-z0-9])(?:AKIA|ASIA)[0-9A-Z]{16}(?![0-9A-Z])")),   # AWS key id
    ("xox", LazyPattern(r"(?<![A-Za-z0-9_-])xox[abprs]-[A-Za-z0-9-]{10,}")),  # Slack
    ("aiza", LazyPattern(r"(?<![A-Za-z0-9_-])AIza[A-Za-z0-9_-]{35,}")),      # Google API key
    ("eyj", LazyPattern(r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}"   # JWT
                       r"\.[A-Za-z0-9_-]*")),
    ("pypi-", LazyPattern(r"(?<![A-Za-z0-9_-])pypi-AgE[A-Za-z0-9_-]{50,}")),   # PyPI upload token
    ("npm_", LazyPattern(r"(?<![A-Za-z0-9_])npm_[A-Za-z0-9]{36,}")),
)
# a bearer token without its header; it holds a digit, so "Bearer authentication" stays
_BEARER = LazyPattern(r"(?i)(?<![A-Za-z0-9_-])(bearer[ \t]{1,8})"
                     r"(?=[A-Za-z._~+/=-]{0,1024}[0-9])[A-Za-z0-9._~+/=-]{16,}")
_NEEDLES = (tuple(n for n, *_ in _SHAPES) + _PAIR_NEEDLES + tuple(n for n, _ in _TOKENS)
            + ("bearer",))


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    for value in secrets:
        if value in text:
            text = text.replace(value, REDACTED)
    lower = text.lower()
    if not any(needle in lower for needle in _NEEDLES):   # fast path: no pattern could match
        return text
    for needle, pattern, replacement in _SHAPES:
        if needle in lower:
            text = pattern.sub(replacement, text)
    if any(needle in lower for needle in _PAIR_NEEDLES):
        text = _mask_pairs(text)
    for needle, pattern in _TOKENS:
        if needle in lower:
            text = pattern.sub(REDACTED, text)
    if "bearer" in lower:
        text = _BEARER.sub(r"\g<1>" + REDACTED, text)
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
