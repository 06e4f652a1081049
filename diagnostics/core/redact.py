"""Secrets never leave a result: applied to every document before anything shows or saves it.

Two kinds of secret are masked wherever they appear in a result (summary, findings, data, log,
error message, traceback, stderr — and the keys of data too):
- values we know: the target's ``env:`` values whose name says secret (token, secret, key,
  password, passwd, passphrase, credential, authorization, signature), as hosts.yaml gave them
  to the diagnostic;
- values we recognise: private key blocks (bounded: a block cut off before its END line costs
  only its own lines); credentials inside URLs; a value given to a name that says secret, in
  the shapes ``env``, shells, config files and Python print (``NAME=value``, ``NAME = "value"``,
  ``aws_secret_access_key = …``, ``{'NAME': 'value'}``, ``"NAME": "value"``, ``NAME: value``
  anywhere on a line, a YAML block scalar ``NAME: |``, ``--name value``, ``Authorization: Bearer
  …``); the shapes whose names do not say secret (.netrc's ``password``, cookies, Docker's
  ``"auth"``, ``mysql -pVALUE``, ``sshpass -p``, ``curl -u user:VALUE``, Slack webhook URLs); and
  the token formats of the services ML teams use (Hugging Face, GitHub, GitLab,
  OpenAI/Anthropic, Stripe, AWS access key ids, Slack, Google API keys, JWTs, PyPI, npm).

Every pattern runs in linear time, whatever a target prints: each one starts only where its
first character cannot continue a longer run of the same class (a negative lookbehind), every
repetition before a required character is bounded, and a secret's value ends the pattern, so a
match never backtracks through it. A name is matched first and its value read only when the
name says secret, so ``a=a=a=…`` costs one short match per ``=``. Where a shape needs context
(the command a ``-p`` belongs to, the line before a ``.netrc`` ``password``), the code looks at
most a bounded distance back.

It is a safety net, not a licence: diagnostics still redact at the source (env-report does).
"""

import re
from functools import lru_cache
from typing import Any, Dict, Iterable, List, Optional, Tuple

from .lean_imports import LazyPattern

# Each pattern below is compiled when first used (LazyPattern): compiling all of them costs
# milliseconds at every start, and most texts never reach one (each waits for its needle, see
# redact_text).

REDACTED = "<redacted>"
NOT_SECRET = frozenset(["MONKEY", "TURNKEY"])   # one-part names that end with KEY
# a value this short is more likely a flag than a secret, and masking it would mangle text
MIN_SECRET_LEN = 4

# A name says secret when one of its parts (split at _ . -) ends with one of these...
_SECRET_PARTS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL",
                 "CREDENTIALS", "AUTHORIZATION", "SIGNATURE")
# ...or its last part ends with KEY: a key elsewhere in a name is a tensor or a setting
# (key_states, past_key_values, query_key_value, host_key_policy), not a secret
_SECRET_LAST_PARTS = ("KEY",)
# ...unless its last part says it names something else (a policy, a path, a size, a count)
_NOT_SECRET_LAST = ("POLICY", "FILE", "PATH", "DIR", "TYPE", "NAME", "ID", "IDS", "LEN", "LENGTH",
                    "SIZE", "COUNT", "DIM", "ERROR", "EXCEPTION", "WARNING", "STDIN", "VERSION")
# ...or it is one of these whole names (parts joined by _): an Azure SAS URL's sig=, and a GCP
# service account's private_key_id (an ID, but the id of the key that file holds)
_SECRET_NAMES = frozenset(["SIG", "PRIVATE_KEY_ID"])
# a tokenizer's special tokens (eos_token='</s>') are vocabulary, printed by every ML tool
_SPECIAL_TOKEN_ROLES = ("BOS", "EOS", "PAD", "UNK", "SEP", "CLS", "MASK")


@lru_cache(maxsize=4096)   # a log repeats its names (loss=, lr=, mem:) on every line
def is_secret_name(name: str) -> bool:
    """HF_TOKEN, DB_PASSWORD, WANDB_API_KEY, aws_secret_access_key, X-Amz-Signature: yes.
    TOKENIZERS_PARALLELISM, host_key_policy, num_key_value_heads, tokenizer_path, KeyError,
    eos_token, signature_version: no."""
    upper = name.upper()
    if upper in NOT_SECRET:
        return False
    parts = [p for p in re.split(r"[_.-]", upper) if p]
    if "_".join(parts) in _SECRET_NAMES:
        return True
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


def _masked_group(match: "re.Match[str]", group: str) -> str:
    """The match with its ``group`` replaced by REDACTED (what is before and after it stays)."""
    start, end = match.start(group) - match.start(), match.end(group) - match.start()
    return match[0][:start] + REDACTED + match[0][end:]


def _line_before(text: str, pos: int, limit: int = 256) -> str:
    """The text of the line ``pos`` is on, before it, at most ``limit`` characters: a bounded
    look back, so a flood of matches on one long line costs each match the same."""
    window = max(0, pos - limit)
    return text[text.rfind("\n", window, pos) + 1 or window:pos]


# --- a value given to a name ------------------------------------------------------------------
# Bounded, and led by a lookbehind, so a long run of name characters costs one short attempt.
_NAME = r"[A-Za-z_][A-Za-z0-9_.-]{0,127}"
_SP = r"[ \t]{0,8}"
_HEAD = LazyPattern(r"""
    (?P<q>\\?["'])(?P<quoted>%(name)s)(?P=q)\]?%(sp)s(?:=>?|:)%(sp)s   # 'NAME': "NAME"= ['NAME'] =
  | (?<![\w.-])(?P<header>(?i:(?:proxy-)?authorization))%(sp)s:%(sp)s  # Authorization: mid-line too
  | (?<![\w.-])(?P<assigned>-{0,2}%(name)s)%(sp)s=%(sp)s             # NAME=v, NAME = v, --flag=v
  | (?m:^)[ \t>#*+-]{0,16}(?P<line>%(name)s)%(sp)s:%(sp)s               # NAME: v at a line start
  | (?<![\w.-])(?P<colon>%(name)s)%(sp)s:%(sp)s                         # NAME: v anywhere else
  | (?<![\w.-])(?P<flag>--?%(name)s)[ \t]{1,8}(?=[^\s-])                # --flag v
""" % {"name": _NAME, "sp": _SP}, re.X)
_NAME_KINDS = ("quoted", "header", "assigned", "line", "colon", "flag")
# names that say secret only as a quoted key: Docker's config.json {"auths": {"r": {"auth":
# "BASE64"}}} and its Python repr; a bare `auth: x` or `--auth-none` is a setting
_QUOTED_SECRET_NAMES = frozenset(["auth"])
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
    r"(?i)[0-9.]{1,6}|true|false|none|null|yes|no|on|off|<[^<>\s]{0,40}>|\$\{?\w+\}?|\*+")
# After the bare words `key:` and `token:` in the middle of a line (`ValueError: invalid token:
# expected 3 parts`, `Missing key: model.layers.0.weight`), a word or a dotted path of words and
# numbers is prose or a module's name; a value with a digit or a symbol in a word is what
# secrets look like. After any other secret name (`password: x`, `api_key: x`) a value is one.
_PROSE_NAMES = frozenset(["KEY", "TOKEN"])
_PROSE_VALUE = LazyPattern(r"[A-Za-z]+(?:[_-][A-Za-z]+)*|(?:[A-Za-z_]+|[0-9]+)(?:\.(?:[A-Za-z_]+|[0-9]+))+")
# a YAML block scalar's indicator (`private_key: |`, `>-`, `|2`): the value is the indented lines
_BLOCK_SCALAR = LazyPattern(r"[|>][+-]?[1-9]?[+-]?[ \t]{0,64}(?=\r?\n)")
_PAIR_NEEDLES = ("token", "secret", "pass", "key", "credential", "authorization", "sig", "auth")


def _block_scalar_body(text: str, key_line: int, after: int) -> Tuple[int, int]:
    """(start, end) of the text of a YAML block scalar whose indicator ends at ``after``, on the
    line that starts at ``key_line``: its lines are blank or indented deeper than that line.
    (start == end: no such line.) Each line is read once; the caller skips past ``end``."""
    indent = len(text[key_line:after]) - len(text[key_line:after].lstrip(" \t"))
    pos = text.find("\n", after) + 1
    start = end = pos
    while 0 < pos <= len(text):
        nl = text.find("\n", pos)
        nl = len(text) if nl < 0 else nl
        line = text[pos:nl]
        content = line.lstrip(" \t")
        if content.strip():
            if len(line) - len(content) <= indent:
                break
            if start == end:
                start = pos + len(line) - len(content)
            end = pos + len(line.rstrip())
        pos = nl + 1
    return start, end


def _keeps_bare_value(kind: str, name: str, body: str) -> bool:
    """Whether the unquoted value ``body`` given to the secret ``name`` stays readable."""
    if _NOT_A_SECRET_VALUE.fullmatch(body):
        return True
    if len(body) < MIN_SECRET_LEN:
        # short: a flag more likely, except for an environment variable (`WANDB_API_KEY=abc`)
        return not (kind == "assigned" and name.isupper())
    return kind == "colon" and (body.startswith(REDACTED) or (
        name.upper() in _PROSE_NAMES and _PROSE_VALUE.fullmatch(body) is not None))


def _mask_pairs(text: str) -> str:
    pieces: List[str] = []
    done = 0   # text before this is copied (or masked) already
    for head in _HEAD.finditer(text):
        if head.start() < done:
            continue   # a name inside a value just masked
        kind = next(k for k in _NAME_KINDS if head[k] is not None)
        name, name_start = head[kind], head.start(kind)
        if kind == "colon" and not _line_before(text, name_start).strip(" \t>#*+-"):
            kind = "line"   # indented deeper than the line pattern's bounded prefix reaches
        if kind == "quoted" and name.lower() in _QUOTED_SECRET_NAMES:
            pass
        elif kind != "header" and not is_secret_name(name):
            continue
        if kind in ("line", "colon") and _BLOCK_SCALAR.match(text, head.end()):
            line_start = text.rfind("\n", 0, name_start) + 1
            start, end = _block_scalar_body(text, line_start, head.end())
            if start < end:
                pieces += [text[done:start], REDACTED]
                done = end
            continue
        value = _VALUE.match(text, head.end())
        if value is None:
            continue
        value_kind = value.lastgroup
        body = value[value_kind]
        if (_keeps_bare_value(kind, name, body) if value_kind == "bare"
                else _NOT_A_SECRET_VALUE.fullmatch(body)):
            continue
        pieces += [text[done:value.start(value_kind)], REDACTED]
        done = value.end(value_kind)
    pieces.append(text[done:])
    return "".join(pieces)


# --- shapes whose name does not say secret ----------------------------------------------------
# A private key block: its BEGIN line; the body (base64 lines, the armor headers of encrypted
# PEM and PGP, blank lines) on lines of its own or, printed with its newlines turned into spaces
# (`echo $KEY`), on the BEGIN line; its END line. A line that is not body ends the block, so a key
# cut off before its END line costs only itself, not the rest of the text. Newlines may be
# escaped (a key inside a JSON string).
_PEM_NL = r"(?:\r?\n|\\r\\n|\\n)"
_PEM_LINE_END = r"(?=\r?\n|\\[rn]|\\?[\"']|-----END|\Z)"
_PRIVATE_KEY = LazyPattern(r"""
    -----BEGIN[A-Z0-9 ]{0,40}PRIVATE\ KEY(?:\ BLOCK)?-----
    (?:[ \t]{0,8}[A-Za-z0-9+/=]+(?=[ \t]|%(end)s))*
    (?:%(nl)s[ \t]{0,64}
       (?:(?:Proc-Type|DEK-Info|Version|Comment|Charset|Hash):[ \t][^\r\n\\]{0,256}
        |[A-Za-z0-9+/=]+)?
       [ \t]{0,64}%(end)s)*
    (?:[ \t]{0,64}(?:%(nl)s[ \t]{0,64})?-----END[A-Z0-9 ]{0,40}PRIVATE\ KEY(?:\ BLOCK)?-----)?
""" % {"nl": _PEM_NL, "end": _PEM_LINE_END}, re.X)

# .netrc: `machine H login U password V`, `default login U password V` on one line; and
# `password V` on a line of its own after a `machine`/`login` line (the same entry, split)
_NETRC = LazyPattern(r"""
    (?<![\w.-])(?:(?:machine|login|account)[ \t]{1,8}[^\s]{1,256}|default)
      [ \t]{1,8}password[ \t]{1,8}(?P<inline>[^\s]+)
  | (?m:^)[ \t]{0,16}password[ \t]{1,8}(?P<alone>[^\s]+)(?=[ \t]*\r?(?:\n|\Z))
""", re.X)
_NETRC_WORDS = ("machine", "login", "default", "account")


def _mask_netrc(match: "re.Match[str]") -> str:
    group = "inline" if match["inline"] is not None else "alone"
    if _NOT_A_SECRET_VALUE.fullmatch(match[group]):
        return match[0]
    if group == "alone":
        before = match.string[max(0, match.start() - 256):match.start()].rstrip(" \t\r\n")
        previous = before[before.rfind("\n") + 1:].split()
        if not previous or previous[0] not in _NETRC_WORDS:
            return match[0]   # `password required` in prose, not a .netrc entry
    return _masked_group(match, group)


# Cookie: and Set-Cookie: headers (and 'Cookie': in a dict): every value but a cookie's
# attributes (Path=/, Expires=…) is a session, and the names (sessionid, session, _ga) never say so
_COOKIE = LazyPattern(
    r"(?i)(?<![\w-])(?:set-)?cookie[\"']?[ \t]{0,8}:[ \t]{0,8}[\"']?(?P<pairs>[^\r\n\"']{1,8192})")
_COOKIE_PAIR = LazyPattern(r"(?<![^;\s])(?P<name>[^=;\s]{1,256})=(?P<value>[^;\s]+)")
_COOKIE_ATTRIBUTES = frozenset(["path", "domain", "expires", "max-age", "samesite", "version",
                                "comment", "priority"])


def _mask_cookie_pair(pair: "re.Match[str]") -> str:
    if pair["name"].lower() in _COOKIE_ATTRIBUTES or pair["value"] == REDACTED:
        return pair[0]
    return _masked_group(pair, "value")


def _mask_cookie(match: "re.Match[str]") -> str:
    start = match.start("pairs") - match.start()
    return match[0][:start] + _COOKIE_PAIR.sub(_mask_cookie_pair, match["pairs"])


# A password on a command line, after the flag its command reads it from: `mysql -pVALUE`
# (glued: `-p VALUE` makes mysql prompt, VALUE is the database), `sshpass -p VALUE`,
# `curl -u user:VALUE`. The command is the last of these on the line before the flag.
_PASSWORD_FLAG = LazyPattern(r"""
    (?<![\w-])-p(?P<glued>[^\s'"-][^\s'"]*)
  | (?<![\w-])-p[ \t]{1,8}(?P<spaced>[^\s'"-][^\s'"]*)
  | (?<![\w-])(?:-u|--user)(?:[ \t]{1,8}|=)?['"]?[^\s:'"]{1,256}:(?P<userpass>[^\s'"]+)
""", re.X)
_PASSWORD_COMMAND = LazyPattern(r"(?<![\w.-])(?:mysql[a-z]{0,8}|mariadb[a-z-]{0,12}|sshpass|curl)"
                                r"(?![\w.-])")
_PASSWORD_COMMAND_NAMES = ("mysql", "mariadb", "sshpass", "curl")
_FLAG_COMMANDS = {"glued": ("mysql", "mariadb", "sshpass"), "spaced": ("sshpass",),
                  "userpass": ("curl",)}


def _mask_command_password(match: "re.Match[str]") -> str:
    group = match.lastgroup
    line = _line_before(match.string, match.start())
    # the last command named on the line (found from the end: a flood of them costs no more)
    last = max(line.rfind(name) for name in _PASSWORD_COMMAND_NAMES)
    command = _PASSWORD_COMMAND.match(line, last) if last >= 0 else None
    if command is None or not command[0].startswith(_FLAG_COMMANDS[group]) \
            or _NOT_A_SECRET_VALUE.fullmatch(match[group]):
        return match[0]
    return _masked_group(match, group)


# --- values recognised by their shape ---------------------------------------------------------
# (lower-case strings one of which every match contains, so the pattern is skipped when all are
#  absent; the pattern; what replaces a match)
_SHAPES = (
    (("private key",), _PRIVATE_KEY, REDACTED),
    (("://",), LazyPattern(r"(?i)(?<![a-z0-9+.-])([a-z][a-z0-9+.-]{0,31}://[^/\s:@]{0,256}:)"
                          r"[^/\s@]{1,1024}(?=@)"),                      # scheme://user:PASSWORD@
     r"\g<1>" + REDACTED),
    (("password",), _NETRC, _mask_netrc),
    (("cookie",), _COOKIE, _mask_cookie),
    (_PASSWORD_COMMAND_NAMES, _PASSWORD_FLAG, _mask_command_password),
    (("hooks.slack.com",),                                               # Slack webhook URL
     LazyPattern(r"(?<![\w.-])(hooks\.slack\.com/(?:services|workflows|triggers)/"
                 r"(?:[A-Za-z0-9_-]{1,64}/){0,4})[A-Za-z0-9_-]{8,}(?![\w/-])"),   # the last segment
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
_NEEDLES = (tuple(n for needles, *_ in _SHAPES for n in needles) + _PAIR_NEEDLES
            + tuple(n for n, _ in _TOKENS) + ("bearer",))
# the fast path needs only the needles that hold no other one ("password" holds "pass")
_FAST_PATH_NEEDLES = tuple(sorted(n for n in set(_NEEDLES)
                                  if not any(m != n and m in n for m in _NEEDLES)))


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    for value in secrets:
        if value in text:
            text = text.replace(value, REDACTED)
    lower = text.lower()
    if not any(needle in lower for needle in _FAST_PATH_NEEDLES):   # no pattern could match
        return text
    for needles, pattern, replacement in _SHAPES:
        if any(needle in lower for needle in needles):
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
