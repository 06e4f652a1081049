"""Secrets are masked in result documents (diagnostics/core/redact.py).

The two tables below are also what bench/redact.py scores redact.py and detect-secrets on.
Every pattern and rule of redact.py has a row here that fails without it (checked with mutmut).
"""

import json
import math
import signal
import time
from contextlib import contextmanager

import pytest

from diagnostics.core import redact
from diagnostics.core.results import Result

# Real-world shapes. Token-like values are assembled from parts so that no scanner mistakes this
# file for a leak; each is the length and alphabet of the real format.
HF = "hf_" + "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3z"
GHP = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
GITHUB_PAT = "github_pat_" + "11ABCDEFG0" + "_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8s9T0u1V2w3X4y5Z6a7B8c9"
GLPAT = "glpat-" + "xR4nD0m-T0k3n_v4lu3Zz"
OPENAI = "sk-proj-" + "Ab1Cd2Ef3Gh4Ij5Kl6Mn7Op8Qr9St0Uv1Wx2Yz3"
ANTHROPIC = "sk-ant-api03-" + "Zy9Xw8Vu7Ts6Rq5Po4Nm3Lk2Ji1Hg0Fe9Dc8Ba7"
STRIPE = "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc"
STRIPE_RESTRICTED = "rk_test_" + "51Hx2Yz3Ab4Cd5Ef6Gh7Ij8K"
AWS_ID = "AKIA" + "IOSFODNN7EXAMPLE"
AWS_STS_ID = "ASIA" + "Q3EGRTZ7EXAMPLE1"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
SLACK = "xoxb-" + "1234567890-0987654321-AbCdEfGhIjKlMnOpQrStUv"
GOOGLE = "AIza" + "SyA-1234567890abcdefghijklmnopqrstu"
JWT = ("eyJ" + "hbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9" + ".eyJ" + "zdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4ifQ"
       + "." + "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c")
PYPI = "pypi-AgE" + "IcHlwaS5vcmcCJGE0ZjA1ZTQxLWEyYjMtNGM1ZC04ZTlmLTBhMWIyYzNkNGU1ZgACKl"
NPM = "npm_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
PEM = ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\n"
       "AAAAAAAAABAAAAMwAAAAtzc2gtZW\n-----END OPENSSH PRIVATE KEY-----")
RSA = ("-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun\n"
       "VTLw7onLRnrq0/IzW7yWR7QkrmBL7jTKEn5u+qKhbwKfBstIs+bMY2Zkp18gnTxK\n-----END RSA PRIVATE KEY-----")
PGP = "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlQOYBF5mQ0QBCAC3k9a0p2Xq7mF8N2kLw\n=Ab1c\n-----END PGP PRIVATE KEY BLOCK-----"

# (text, the secret in it: must be gone from the redacted text)
SECRETS = [
    (f"aws_secret_access_key = {AWS_SECRET}", AWS_SECRET),                     # ~/.aws/credentials
    ("aws_session_token=IQoJb3JpZ2luX2VjEJr//////////wEaCXVzLWVhc3QtMSJH", "IQoJb3JpZ2luX2VjEJr"),
    ("{'db_password': 'hunter2hunter2'}", "hunter2hunter2"),                 # Python dict repr
    ("{'HF_TOKEN': 'tok-9f8e7d6c5b4a'}", "tok-9f8e7d6c5b4a"),
    ("RuntimeError: bad config {'host': 'db', 'db_password': 'p4ss-w0rd!'}", "p4ss-w0rd!"),
    ("WANDB_API_KEY='0123456789abcdef0123456789abcdef01234567'", "0123456789abcdef0123456789abcdef01234567"),
    ('DB_PASSWORD="correct horse battery staple"', "horse battery"),
    ('hf_token: "abcd1234efgh"', "abcd1234efgh"),                           # YAML
    ("export DB_PASSWORD = s3cretvalue", "s3cretvalue"),                     # spaces around =
    ("vllm serve m --token abc123def456 --port 8000", "abc123def456"),       # --flag value
    ("mysql -u root --password hunter2hunter2", "hunter2hunter2"),
    ("mysql -u root --password=hunter2hunter2", "hunter2hunter2"),
    (f"Authorization: Bearer {JWT}", JWT),
    ('curl -H "Authorization: Basic dXNlcjpwYXNzd29yZA==" https://x', "dXNlcjpwYXNzd29yZA=="),
    ('curl -H "Proxy-Authorization: Basic dXNlcjpwYXNzd29yZA=="', "dXNlcjpwYXNzd29yZA=="),
    ("headers={'Authorization': 'Basic dXNlcjpwYXNzd29yZA=='}", "dXNlcjpwYXNzd29yZA=="),
    ("Bearer 0123456789abcdefghij was refused", "0123456789abcdefghij"),
    (f"git clone https://oauth2:{GLPAT}@gitlab.example.com/x.git", GLPAT),
    (f"gitlab token {GLPAT} expired", GLPAT),
    (f"key={GOOGLE}&q=1", GOOGLE),
    (f"maps: {GOOGLE}", GOOGLE),
    (f"stripe.api_key {STRIPE}", STRIPE),
    (f"restricted {STRIPE_RESTRICTED}", STRIPE_RESTRICTED),
    (f"MY_{HF}", HF),                                                        # hf_ glued after _
    (f"login with {HF}", HF),
    (f"remote: {GHP}", GHP),
    (f"token {GITHUB_PAT}", GITHUB_PAT),
    (f"openai.AuthenticationError: Incorrect API key provided: {OPENAI}", OPENAI),
    (f"client = Anthropic(api_key={ANTHROPIC!r})", ANTHROPIC),
    (f"{AWS_ID} used", AWS_ID),
    (f"{AWS_STS_ID} used", AWS_STS_ID),
    (f"slack: {SLACK}", SLACK),
    (f"jwt {JWT}", JWT),
    (f"twine upload -p {PYPI}", PYPI),
    (f"//registry.npmjs.org/:_authToken={NPM}", NPM),
    ("//registry.npmjs.org/:_authToken=0123abcd-ef45-6789", "0123abcd-ef45-6789"),
    (f"key file:\n{PEM}\nend", "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ"),
    (RSA, "MIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun"),
    (PGP, "lQOYBF5mQ0QBCAC3k9a0p2Xq7mF8N2kLw"),
    ("-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIIrYSSNQFaA2Hwf1duRSxKtLYX5CB04fSeQ6tF1aY/PuoAoGCCqGSM49",
     "MHcCAQEEIIrYSSNQFaA2Hwf1duRSxKtLYX5CB04fSeQ6tF1aY"),                  # cut off: no END
    ("DATABASE_URL=postgres://admin:s3cr3tP4ss@db:5432/x", "s3cr3tP4ss"),
    ("redis://:s3cr3tP4ss@cache:6379/0", "s3cr3tP4ss"),                      # no user name
    ('{"password": "p@ss w0rd"}', "p@ss w0rd"),                             # JSON, space inside
    ('{"password":"pa\\"ss1234"}', "ss1234"),                               # JSON, escaped quote
    ('log: "{\\"api_key\\": \\"abcd1234\\"}"', "abcd1234"),                 # JSON inside JSON
    ("os.environ['DB_PASSWORD'] = 'hunter2hunter2'", "hunter2hunter2"),
    ('config.hf_token = "abcdef123456"', "abcdef123456"),
    ("x-api-key: 0123456789abcdef", "0123456789abcdef"),                    # HTTP header line
    ("> X-Api-Key: 0123456789abcdef", "0123456789abcdef"),                  # curl -v
    ("  - password: hunter2hunter2", "hunter2hunter2"),                     # YAML list item
    ("SSH_KEY_PASSPHRASE=longpassphrase1", "longpassphrase1"),
    ("PGPASSWORD=hunter2hunter2 psql -h db", "hunter2hunter2"),
    ("'password' => 'hunter2hunter2'", "hunter2hunter2"),                   # Ruby / PHP
    ("Config(api_key=b'0123456789abcdef')", "0123456789abcdef"),            # bytes repr
    ("DB_PASSWORD=20240101", "20240101"),                                    # digits, but long
    ('client_secret: "abc-123-def"', "abc-123-def"),
    ("GET /v1/models?access_token=abcd1234wxyz&limit=5", "abcd1234wxyz"),
    ("+ HF_TOKEN=abcd1234efgh", "abcd1234efgh"),                            # set -x
    ("env=HF_TOKEN=abcd1234efgh", "abcd1234efgh"),                          # a pair in a value
    ("password: hunter22", "hunter22"),
    (f"npm token {NPM} revoked", NPM),
    ("+password: hunter2hunter2", "hunter2hunter2"),                       # a line of git diff
    ("# token: abcd1234efgh", "abcd1234efgh"),                              # commented out
    ("* api_key: abcd1234efgh", "abcd1234efgh"),                            # a Markdown list
    ("\tpassword: hunter2hunter2", "hunter2hunter2"),
    ("config {api_key: b'0123456789abcdef'}", "0123456789abcdef"),
    ('token=b"0123456789abcdef"', "0123456789abcdef"),
    ('auth: {token: "abcd1234efgh"}', "abcd1234efgh"),                      # YAML flow, JS
    ("config {password: 'p4ss-w0rd!'}", "p4ss-w0rd!"),
    ("git+ssh://git:s3cr3tP4ss@host/x", "s3cr3tP4ss"),
    (f"oauth {GHP.replace('ghp_', 'gho_')}", GHP[4:]),
    (f"user {GHP.replace('ghp_', 'ghu_')}", GHP[4:]),
    (f"server {GHP.replace('ghp_', 'ghs_')}", GHP[4:]),
    (f"refresh {GHP.replace('ghp_', 'ghr_')}", GHP[4:]),
    (f"user {SLACK.replace('xoxb-', 'xoxp-')}", SLACK[5:]),
    (f"app {SLACK.replace('xoxb-', 'xoxa-')}", SLACK[5:]),
    (f"refresh {SLACK.replace('xoxb-', 'xoxr-')}", SLACK[5:]),
    (f"session {SLACK.replace('xoxb-', 'xoxs-')}", SLACK[5:]),
    ("DOCKER_CREDENTIAL=abcd1234wxyz", "abcd1234wxyz"),
    ("token is s3cr3t-value here", "s3cr3t-value"),                          # (a known secret)
    ("auth: api_key: abcdef123", "abcdef123"),                           # nested YAML, one line
]

# Issue 29: shapes that passed unmasked. Each is also tested alone and inside a longer text
# (SHAPES_IN_CONTEXT), and printed by a script through the real lab
# (tests/integration/test_redaction_remote.py).
DOCKER_AUTH = "YWxpY2U6" + "cjNnaXN0cnktcDRzcw=="          # base64("alice:r3gistry-p4ss")
SAS_SIG = "Zm9vYmFy" + "MTIzNDU2Nzg5MA%3D%3D"
SIGV4 = "5d672d79c15b13162d9279b0855cfba6" + "789a8edb4c82c400e06b5924a6f2b5d7"
SLACK_HOOK_SECRET = "Xq3bZ9kP2mLw" + "8vR4tYh6nJc1"
KEY_ID = "a1b2c3d4e5f6a7b8c9d0" + "e1f2a3b4c5d6e7f8a9b0"
ISSUE_29_SHAPES = [
    ("machine api.example.com login alice password n3trc-Pw0rd", "n3trc-Pw0rd"),     # .netrc
    ("machine api.example.com\n  login alice\n  password n3trc-Pw0rd", "n3trc-Pw0rd"),
    ("machine api.example.com\nlogin alice\npassword hunterhunter", "hunterhunter"),
    ("default login alice password n3trc-Pw0rd", "n3trc-Pw0rd"),
    ("machine h password n3trc-Pw0rd login alice", "n3trc-Pw0rd"),
    ("Cookie: sessionid=s3ss10nV4lue; csrftoken=csrfV4lue99", "s3ss10nV4lue"),
    ("cookie: csrftoken=csrfV4lue99; sessionid=s3ss10nV4lue", "s3ss10nV4lue"),
    ("Set-Cookie: session=s3ss10nV4lue; Path=/; HttpOnly", "s3ss10nV4lue"),
    ("headers = {'Cookie': 'sid=s3ss10nV4lue'}", "s3ss10nV4lue"),
    ('> cookie: _ga=GA1.2.3; sid=s3ss10nV4lue', "s3ss10nV4lue"),                      # curl -v
    ('{"auths": {"registry.example.com": {"auth": "%s"}}}' % DOCKER_AUTH, DOCKER_AUTH),
    ("{'auths': {'registry.example.com': {'auth': '%s'}}}" % DOCKER_AUTH, DOCKER_AUTH),
    ('curl -H "X-Api-Key: ak-7f3e9c2b1d" https://api.example.com', "ak-7f3e9c2b1d"),
    ("requests: headers X-Auth-Token: tok7f3e9c2b1d", "tok7f3e9c2b1d"),
    ("> X-Vault-Token: hvs.CAESIJ7f3e9c2b1d", "hvs.CAESIJ7f3e9c2b1d"),
    ("sent Private-Token: glt7f3e9c2b1d4a", "glt7f3e9c2b1d4a"),                      # GitLab
    ("mysql -h db -u root -pMyPa55word training", "MyPa55word"),
    ("mysqldump -uroot -pMyPa55word --all-databases", "MyPa55word"),
    ("sshpass -p MyPa55word ssh user@host", "MyPa55word"),
    ("sshpass -pMyPa55word scp x host:", "MyPa55word"),
    ("curl -u alice:MyPa55word https://x", "MyPa55word"),
    ("curl -s --user alice:MyPa55word https://x", "MyPa55word"),
    ("curl -sS -ualice:MyPa55word https://x", "MyPa55word"),
    ("db:\n  password: hunterhunter", "hunterhunter"),                                # YAML
    ("                      password: hunterhunter", "hunterhunter"),               # deep YAML
    ("https://acct.blob.core.windows.net/c/b?sv=2022-11-02&se=2026-12-05&sp=r&sig=" + SAS_SIG,
     SAS_SIG),
    ("AccountName=acct;AccountKey=" + SAS_SIG + ";EndpointSuffix=core.windows.net", SAS_SIG),
    ("Authorization: AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261204/us-east-1/s3/aws4_request, "
     "SignedHeaders=host;x-amz-date, Signature=" + SIGV4, SIGV4),
    ("GET /b/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature=" + SIGV4, SIGV4),
    ("https://hooks.slack.com/services/T0123ABCD/B0123ABCD/" + SLACK_HOOK_SECRET, SLACK_HOOK_SECRET),
    ('"private_key_id": "%s",' % KEY_ID, KEY_ID),                          # GCP service account
    ("2026-12-04 10:00:01 INFO config password: MyPa55word", "MyPa55word"),
    ("[INFO] api_key: ak7f3e9c2b1d", "ak7f3e9c2b1d"),
    ("using token: tok-7f3e9c2b1d", "tok-7f3e9c2b1d"),
    ("ERROR login failed, password: hunterhunter", "hunterhunter"),         # letters only
    ("WANDB_API_KEY=abc", "abc"),                                           # short, env var
    ("HF_TOKEN=x", "=x"),
    ("private_key: |\n  MIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n  BKcwggSjAgEAAoIBAQC7\nnext: 1",
     "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC"),
    ("private_key: |-\n  MIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n  BKcwggSjAgEAAoIBAQC7\nnext: 1",
     "BKcwggSjAgEAAoIBAQC7"),
    ("tls:\n  key: >-\n    c2VjcmV0LWtleS1ib2R5\n\n    bW9yZQ==\n  cert: x", "bW9yZQ=="),
    ("KEY=-----BEGIN PRIVATE KEY----- MIIEvQIBADANBgkqhkiG9w0BAQEF AASCBKcwggSjAgEAAoIBAQC7 "
     "-----END PRIVATE KEY-----", "AASCBKcwggSjAgEAAoIBAQC7"),               # echo $KEY
    ('{"private_key": "-----BEGIN PRIVATE KEY-----\\nMIIEvQIBADANBgkqhkiG9w0BAQEF\\n'
     '-----END PRIVATE KEY-----\\n"}', "MIIEvQIBADANBgkqhkiG9w0BAQEF"),      # JSON, \n escaped
    ("-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,3F17F5316E2BAC89"
     "\n\nMIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun\n"
     "-----END RSA PRIVATE KEY-----", "3F17F5316E2BAC89"),
]
SECRETS += ISSUE_29_SHAPES

# (text): must come back exactly as it was
NEAR_MISSES = [
    "num_key_value_heads=8",
    "tokenizer_path=/models/llama/tok",
    "KeyError: 'model.layers.0.self_attn.k_proj.weight'",
    "KeyError: 'HF_TOKEN'",
    "KeyError: missing_weight",
    "max_tokens=16",
    "TOKENIZERS_PARALLELISM=false",
    "use_auth_token: true",
    "pad_token_id=0",
    "eos_token='</s>'",
    "{'bos_token': '<s>', 'eos_token': '</s>', 'unk_token': '<unk>'}",
    "pad_token=[PAD]",
    "cls_token: CLS1",
    "past_key_values=DynamicCache()",
    "transformer.h.0.self_attention.query_key_value.weight: torch.Size([12288, 4096])",
    "key_states.shape=(1, 32, 128, 128)",
    "token_type_ids=tensor([[0, 0, 0]])",
    "host_key_policy: accept-new",
    "hostkey: host key for [h]:22 is not known (or set host_key_policy: accept-new for it)",
    "HF_TOKEN=${HF_TOKEN}",
    "HF_TOKEN=$HF_TOKEN",
    "password: ********",
    "HF_TOKEN=<your-hf-token>",
    '"api_key": null',
    "api_key=None",
    "max_key=4096",
    "--max-new-tokens 256",
    "--tokenizer-path /models/tok",
    "--hf-token-file /run/secrets/hf",
    "--use-auth-token --model m",
    "echo $P | docker login --password-stdin registry.example.com",
    "if token == expected:",
    "https://hub.example.org/models/x",
    "git@github.com:org/repo.git",
    "pip install scikit-learn sk-video",
    "MONKEY=patch KEYBOARD=us",
    "error: key: value pairs expected",
    "token_count=1024",
    "keys=['a', 'b']",
    "Bearer authentication is configured",
    "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl user@host",
    "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEqk3Y\n-----END PUBLIC KEY-----",
    "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUe1\n-----END CERTIFICATE-----",
    "uuid=123e4567-e89b-12d3-a456-426614174000",
    "commit 95504db1f8eb918f8dd630a92167ce7917dd0f8e",
    "CUDA_VISIBLE_DEVICES=0,1,2,3",
    "max_position_embeddings: 4096",
    "rope_scaling={'type': 'linear', 'factor': 2.0}",
    "model.embed_tokens.weight torch.Size([32000, 4096])",
    "Token indices sequence length is longer than the specified maximum (5000 > 4096)",
    "tokens/s: 1234.5",
    "eval_tokens_per_second=812.3",
    '{"token_usage": {"prompt_tokens": 12}}',
    "x-x-x-x-x-x",
    "hf_hub_download(repo_id='meta-llama/Llama-3-8B', filename='config.json')",
    "AKIA is the prefix of an AWS key id",
    "use_auth_token=False",
    '"save_password": "yes"',
    "{'ask_password': 'no'}",
    "HF_HUB_DISABLE_IMPLICIT_TOKEN=1",
    "--disk-cache-directory-for-the-models /x",
    # issue 29: near-misses from training logs, next to the shapes it masks
    "max_new_tokens=256",
    "[INFO] max_new_tokens: 256",
    "token_type_ids: tensor([[0, 0]])",
    "tokenizer: Qwen2Tokenizer",
    "[INFO] tokenizer: Qwen2Tokenizer(name_or_path='Qwen/Qwen2-7B')",
    "--auth-none",
    "auth: none",
    "use_auth: true",
    "NCCL_IB_HCA=mlx5_0",
    "KeyError: 'password'",
    "ValueError: invalid token: expected three parts",
    "RuntimeError: Missing key: model.layers.0.self_attn.q_proj.weight",
    "error: sort key: val_loss",
    "signature_version='s3v4'",
    "mkdir -p /tmp/run-1 && curl -sSfL https://example.org/x -o x",
    "docker run -u 1000:1000 img",
    "pip install -U torch && curl -u",
    "mysql -p training",
    "the password is required",
    "password expired",
    "Set-Cookie: Path=/; HttpOnly",
    "Cookie:",
    "hooks.slack.com/services",
    "key: |",
    "comment: |\n  free text\nnext: 1",
    "-----BEGIN RSA PUBLIC KEY-----\nMIIBCgKCAQEA\n-----END RSA PUBLIC KEY-----",
    "step 12 loss=1.9 eval_tokens=4096",
    "Bearer AuthenticationMiddleware installed",
]


def test_the_tables_are_large_enough_to_mean_something():
    assert len(SECRETS) >= 40 and len(NEAR_MISSES) >= 40
    assert len(set(NEAR_MISSES)) == len(NEAR_MISSES) and len({t for t, _ in SECRETS}) == len(SECRETS)


@pytest.mark.parametrize("text, secret", SECRETS, ids=[t[:40] for t, _ in SECRETS])
def test_secret_shapes_are_masked(text, secret):
    out = redact.redact_text(text, ["s3cr3t-value"])   # (a value from hosts.yaml env:)
    assert secret not in out and redact.REDACTED in out
    assert redact.redact_text(out, ["s3cr3t-value"]) == out   # masking twice changes nothing


@pytest.mark.parametrize("text", NEAR_MISSES, ids=[t[:40] for t in NEAR_MISSES])
def test_near_misses_stay_readable(text):
    assert redact.redact_text(text) == text


@pytest.mark.parametrize("text, expected", [
    # what stays around a masked value: the name, the separator, the quotes, an auth scheme
    (f"export HF_TOKEN={HF}", "export HF_TOKEN=<redacted>"),
    ("aws_secret_access_key = wJalrXUtnFEMI", "aws_secret_access_key = <redacted>"),
    ("{'db_password': 'hunter2hunter2', 'host': 'db'}", "{'db_password': '<redacted>', 'host': 'db'}"),
    ('{"password": "pa\\"ss1234", "user": "bob"}', '{"password": "<redacted>", "user": "bob"}'),
    ('log: {\\"api_key\\": \\"abcd1234\\", \\"n\\": 1}', 'log: {\\"api_key\\": \\"<redacted>\\", \\"n\\": 1}'),
    ("Authorization: Bearer abc.def.ghi", "Authorization: Bearer <redacted>"),
    ("headers={'Authorization': 'Bearer abc'}", "headers={'Authorization': '<redacted>'}"),
    ("--token abc123def456 --port 8000", "--token <redacted> --port 8000"),
    ("--hf-token=abcdef123 --model x", "--hf-token=<redacted> --model x"),
    ("Config(api_key=b'0123456789abcdef')", "Config(api_key=b'<redacted>')"),
    ("https://alice:pa55word@hub.example.org/x", "https://alice:<redacted>@hub.example.org/x"),
    ("  api_key: abcdef123", "  api_key: <redacted>"),            # a config line
    ("token=abcd1234&user=bob", "token=<redacted>&user=bob"),
    ("password=ab", "password=ab"),                                # too short for a bare value
    ("password='ab'", "password='<redacted>'"),                    # but quoted, it is one
    ("password=012345", "password=012345"),                        # a number, not a password
    ("password=0123456", "password=<redacted>"),
    ("password: ***", "password: ***"),
    ("password=<redacted>", "password=<redacted>"),
    (f"key file:\n{PEM}\nend", "key file:\n<redacted>\nend"),
    (f"{PEM}\nafter", "<redacted>\nafter"),                         # the block ends at its END line
    (f"{PGP}\nafter", "<redacted>\nafter"),
    ('password="hunter2\nnext: line"', 'password="<redacted>\nnext: line"'),   # a line ends a value
    ('token=b"0123456789abcdef"', 'token=b"<redacted>"'),
    (f"Bearer {JWT}", "Bearer <redacted>"),
    (f"x {HF}_more", "x <redacted>_more"),
    (f"x{HF}", f"x{HF}"),                                          # not a token: glued to a letter
    (AWS_ID + "Z", AWS_ID + "Z"),                                  # 21 characters: not a key id
    ("sk-short", "sk-short"),
    ("xoxb-123456789", "xoxb-123456789"),
])
def test_what_stays_readable_around_a_masked_value(text, expected):
    assert redact.redact_text(text) == expected


# A traceback and log lines around each shape: they must come back exactly as they were.
BEFORE = ("2026-12-04 10:00:00 INFO step 10 loss=2.31 num_key_value_heads=8\n"
          "Traceback (most recent call last):\n  File \"train.py\", line 42, in <module>\n")
AFTER = ("\nRuntimeError: connect failed\nKeyError: 'password'\n"
         "2026-12-04 10:00:01 INFO max_tokens=16 tokenizer_path=/models/tok NCCL_IB_HCA=mlx5_0\n")


@pytest.mark.parametrize("text, secret", ISSUE_29_SHAPES, ids=[t[:40] for t, _ in ISSUE_29_SHAPES])
def test_issue_29_shapes_are_masked_inside_a_longer_text(text, secret):
    out = redact.redact_text(BEFORE + text + AFTER)
    assert secret not in out and redact.REDACTED in out
    assert out.startswith(BEFORE) and out.endswith(AFTER)


TWELVE_LINES = "".join(f"2026-12-04 10:00:{i:02d} INFO step {i} loss=2.{i} lr=3e-4\n"
                       for i in range(12))


@pytest.mark.parametrize("cut_key", [
    "-----BEGIN RSA PRIVATE KEY-----",                                  # the BEGIN line alone
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun",
    "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\n\n",
    "-----BEGIN EC PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,3F17F5316E2BAC89",
])
def test_a_private_key_cut_off_before_its_end_line_costs_only_its_own_lines(cut_key):
    # issue 29: a BEGIN line with no END line once masked everything after it
    out = redact.redact_text(f"loading key\n{cut_key}\n{TWELVE_LINES}")
    assert out == f"loading key\n{redact.REDACTED}\n{TWELVE_LINES}", out


def test_a_line_after_a_cut_off_key_is_kept_whole_even_when_it_starts_like_base64():
    text = "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\nTraceback (most recent call last):\n2026 done"
    assert redact.redact_text(text) == "<redacted>\nTraceback (most recent call last):\n2026 done"


@pytest.mark.parametrize("text, expected", [
    ("machine h login alice password n3trc-Pw0rd\nmachine g",
     "machine h login alice password <redacted>\nmachine g"),
    ("login alice\n  password n3trc-Pw0rd\n", "login alice\n  password <redacted>\n"),
    ("step 1\npassword n3trc-Pw0rd\n", "step 1\npassword n3trc-Pw0rd\n"),   # no .netrc line before
    ("Cookie: sessionid=s3ss; csrftoken=c5rf", "Cookie: sessionid=<redacted>; csrftoken=<redacted>"),
    ("Set-Cookie: sid=s3ss; Path=/; Expires=Wed, 21 Oct 2026 07:28:00 GMT; HttpOnly",
     "Set-Cookie: sid=<redacted>; Path=/; Expires=Wed, 21 Oct 2026 07:28:00 GMT; HttpOnly"),
    ("mysql -h db -u root -pMyPa55word training", "mysql -h db -u root -p<redacted> training"),
    ("sshpass -p MyPa55word ssh -p 2222 host", "sshpass -p <redacted> ssh -p 2222 host"),
    ("ssh -p 2222 host", "ssh -p 2222 host"),                       # not a password flag there
    ("+ mysql -pS3cretPw db", "+ mysql -p<redacted> db"),             # set -x: not at the line start
    ("mysql -e 'select 1'; curl -s x; mysql -pS3cretPw db",          # the last command decides
     "mysql -e 'select 1'; curl -s x; mysql -p<redacted> db"),
    ("mysql -e x; curl -s -pS3cretPw y", "mysql -e x; curl -s -pS3cretPw y"),   # curl's -p: proxytunnel
    ("curl -u alice:MyPa55word https://x", "curl -u alice:<redacted> https://x"),
    ("private_key: |\n  MIIEvQIB\n\n  BKcwggSj\nnext: 1", "private_key: |\n  <redacted>\nnext: 1"),
    ("  token: >-\n    abc\n  user: bob", "  token: >-\n    <redacted>\n  user: bob"),
    ("token: |\nnext: 1", "token: |\nnext: 1"),                     # an empty block: nothing to mask
    ("x:\n" + " " * 20 + "private_key: |\n" + " " * 22 + "MIIEvQIB\n" + " " * 20 + "user: bob",
     "x:\n" + " " * 20 + "private_key: |\n" + " " * 22 + "<redacted>\n" + " " * 20 + "user: bob"),
    ("x -----BEGIN PRIVATE KEY----- MIIEvQ AASC -----END PRIVATE KEY----- y", "x <redacted> y"),
    ("https://hooks.slack.com/services/T01/B01/abcdefgh1234 sent",
     "https://hooks.slack.com/services/T01/B01/<redacted> sent"),
    ("https://x.blob.core.windows.net/c?sp=r&sig=abcd%2B12&se=1", "https://x.blob.core.windows.net/c?sp=r&sig=<redacted>&se=1"),
    ("[INFO] api_key: ak7f3e9c2b1d (from env)", "[INFO] api_key: <redacted> (from env)"),
    ("WANDB_API_KEY=abc", "WANDB_API_KEY=<redacted>"),               # an env var: short is enough
    ("api_key=abc", "api_key=abc"),                                  # lower case: a flag, maybe
    ("HF_TOKEN=on", "HF_TOKEN=on"),
])
def test_what_stays_readable_around_the_issue_29_shapes(text, expected):
    assert redact.redact_text(text) == expected


# --- section 5 of issue 29: each test below fails with one mutant of redact.py ----------------
def test_up_to_eight_spaces_or_tabs_around_a_separator_still_pair_a_name_with_its_value():
    # _SP is [ \t]{0,8}: config files align their columns (mutant: {0,1})
    assert redact.redact_text("DB_PASSWORD        = s3cretvalue") == "DB_PASSWORD        = <redacted>"
    assert redact.redact_text("api_key:\t\t'0123456789abcdef'") == "api_key:\t\t'<redacted>'"


def test_a_hugging_face_token_is_recognised_from_30_characters_after_its_prefix():
    # mutant: {30,} -> {31,}
    at_limit, below = "hf_" + "aB3dE5fG7h" * 3, "hf_" + ("aB3dE5fG7h" * 3)[:29]
    assert redact.redact_text(f"login {at_limit} ok") == "login <redacted> ok"
    assert redact.redact_text(f"login {below} ok") == f"login {below} ok"


def test_a_one_character_password_in_a_url_is_masked():
    # mutant: userinfo {1,1024} -> {2,1024}
    assert redact.redact_text("redis://:x@cache:6379/0") == "redis://:<redacted>@cache:6379/0"
    assert redact.redact_text("https://u:p@host/x") == "https://u:<redacted>@host/x"


def test_the_negotiate_scheme_stays_readable_and_its_token_is_masked():
    # mutant: negotiate dropped from the schemes (then the scheme is masked and the token stays)
    token = "YIIBhgYGKwYBBQUCoIIBejCCAXag"
    assert redact.redact_text(f"Authorization: Negotiate {token}") == \
        "Authorization: Negotiate <redacted>"


def test_a_bearer_word_without_a_digit_is_prose():
    # the digit lookahead of the bearer rule (mutant: removed): 16+ letters after Bearer are a
    # name in a log, not a token
    assert redact.redact_text("Bearer AuthenticationMiddleware installed") == \
        "Bearer AuthenticationMiddleware installed"
    assert redact.redact_text("Bearer Authentication1Middleware") == "Bearer <redacted>"


@pytest.mark.parametrize("name, secret", [
    ("HF_TOKEN", True), ("DB_PASSWORD", True), ("WANDB_API_KEY", True), ("apikey", True),
    ("aws_secret_access_key", True), ("SSH_PASSPHRASE", True), ("PGPASSWD", True),
    ("GOOGLE_CREDENTIALS", True), ("credential", True), ("Authorization", True),
    ("--hf-token", True), ("x-api-key", True), ("TORCH_SECRET_SAUCE", True),
    ("TOKENIZERS_PARALLELISM", False), ("host_key_policy", False), ("num_key_value_heads", False),
    ("tokenizer_path", False), ("KeyError", False), ("max_tokens", False), ("HOSTKEY", False),
    ("ssh_hostkey", False), ("MONKEY", False), ("KEYBOARD", False), ("eos_token", False),
    ("tokenizer.pad_token", False), ("my_eos_token", False), ("bos_token_id", False),
    ("key_states", False), ("past_key_values", False), ("hf_token_file", False),
    ("token_type_ids", False), ("--password-stdin", False), ("_", False), ("", False),
    ("TURNKEY", False), ("password_policy", False), ("hf_token_path", False),
    ("credentials_dir", False), ("token_type", False), ("secret_name", False),
    ("max_token_len", False), ("token_length", False), ("token_size", False),
    ("token_count", False), ("token_dim", False), ("auth_token_error", False),
    ("token_exception", False), ("password_warning", False), ("bos_token", False),
    ("unk_token", False), ("sep_token", False), ("mask_token", False), ("cls_token", False),
    ("pad_token", False), ("hf_token", True), ("sep.token", False),
])
def test_is_secret_name(name, secret):
    assert redact.is_secret_name(name) is secret


def test_known_secrets_are_env_values_with_secret_names_longest_first():
    env = {"HF_TOKEN": "abcd1234", "DB_PASSWORD": "pw-longer-one", "HF_HOME": "/dev/shm/hf",
           "TOKENIZERS_PARALLELISM": "false", "API_KEY": "x", "SHORT_TOKEN": "abc",
           "DUP_TOKEN": "abcd1234", "FOUR_TOKEN": "wxyz"}
    assert redact.known_secrets(env) == ("pw-longer-one", "abcd1234", "wxyz")


def test_a_known_secret_inside_a_longer_one_does_not_leave_the_rest_of_it():
    # "zzzz" sorts first by letters; masked first, it would leave "a-" of the longer value
    env = {"A_TOKEN": "zzzz", "B_TOKEN": "a-zzzz"}
    assert redact.redact_document({"summary": "x a-zzzz y"}, env) == {"summary": "x <redacted> y"}


@pytest.mark.parametrize("index", range(len(redact._TOKENS)),
                         ids=[needle for needle, _ in redact._TOKENS])
def test_every_token_format_has_a_row_that_needs_it(index, monkeypatch):
    # dropping one format (say sk- or github_pat_) must fail a test; no other rule may cover it
    monkeypatch.setattr(redact, "_TOKENS", redact._TOKENS[:index] + redact._TOKENS[index + 1:])
    assert any(secret in redact.redact_text(text, ["s3cr3t-value"]) for text, secret in SECRETS)


@pytest.mark.parametrize("index", range(len(redact._SHAPES)),
                         ids=[needles[0] for needles, *_ in redact._SHAPES])
def test_every_shape_has_a_row_that_needs_it(index, monkeypatch):
    monkeypatch.setattr(redact, "_SHAPES", redact._SHAPES[:index] + redact._SHAPES[index + 1:])
    assert any(secret in redact.redact_text(text, ["s3cr3t-value"]) for text, secret in SECRETS)


def test_a_known_secret_is_masked_whatever_its_shape_and_before_any_pattern():
    # no pattern would find "plain words 42"; the value from hosts.yaml is masked all the same
    assert redact.redact_text("a plain words 42 b plain words 42", ["plain words 42"]) == \
        "a <redacted> b <redacted>"
    assert redact.redact_text("no secret here", ["plain words 42"]) == "no secret here"


def test_text_with_no_secret_comes_back_unchanged_and_untouched():
    text = "step 10 loss=2.31 lr=3e-4 tokens/s=1234 grad_norm=0.9 mem: 40GiB\n" * 50
    assert redact.redact_text(text) is text   # the fast path hands back the same object
    plain = "The quick brown fox jumps over the lazy dog"
    assert redact.redact_text(plain) is plain


def test_redact_masks_strings_keys_lists_and_tuples_and_keeps_other_values():
    value = {"k": [HF, (HF, 3)], HF: None, 7: 1.5, "n": True}
    assert redact.redact(value) == {"k": ["<redacted>", ["<redacted>", 3]], "<redacted>": None,
                                    7: 1.5, "n": True}
    assert redact.redact_document({"summary": HF}) == {"summary": "<redacted>"}


# --- linear time ------------------------------------------------------------------------------
# A target's output that makes a pattern backtrack once cost 67 s of CPU for 80 KB. Each flood
# below aims at one pattern; the line of every needle in front makes every pattern run on it.
ADVERSARIAL = {
    "x-x-x": "x-", "equals": "=", "a=a=": "a=", "base64": "Ab3+/9Zq", "colons": ":",
    "quotes": "\"'", "begin": "-----BEGIN ", "url-user": "://user:", "scheme-user": "a://u:",
    "name-colon": "token: ", "quoted-name": "'key':", "flag": "--token ", "newlines": " \n",
    "line-name": "\nkey: ", "jwt": "eyJxxxxxxxx.", "authorization": "Authorization: ",
    "open-quote": "token='", "escapes": 'token="\\', "bearer": "Bearer a1",
    # issue 29's shapes
    "netrc": "login x password ", "netrc-line": "\npassword x", "cookie": "Cookie: a=b; ",
    "cookie-heads": "cookie:", "mysql": "mysql -pa ", "flag-p": "-pa ", "curl": "curl -u a:",
    "user-flag": "-u a", "block": "key: |\n", "block-body": "key: |\n  a\n", "pem": "-----BEGIN RSA PRIVATE KEY----- ",
    "pem-lines": "-----BEGIN RSA PRIVATE KEY-----\nAb3\n", "pem-body": "\nAb3+/9Zq ",
    "slack": "hooks.slack.com/services/T1/", "mid-colon": "x token: y ", "deep-colon": "    key: ",
}


class _TooSlow(Exception):
    pass


@contextmanager
def _cpu_budget(seconds):
    """Raise _TooSlow once this process has spent ``seconds`` of CPU (the regex engine checks
    for signals as it runs, so a runaway pattern is stopped, not waited for)."""
    def expire(signum, frame):
        raise _TooSlow()
    previous = signal.signal(signal.SIGPROF, expire)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


def _flood(unit, size):
    return " ".join(redact._NEEDLES) + "\n" + (unit * (size // len(unit) + 1))[:size]


@pytest.mark.parametrize("unit", ADVERSARIAL.values(), ids=list(ADVERSARIAL))
def test_redaction_time_grows_linearly_with_hostile_input(unit):
    # 30 KB against 300 KB: the same tenfold step as 100 KB against 1 MB, a third of the suite's
    # time (35 inputs: 66 s -> about 20 s on 2 cores)
    small, big = _flood(unit, 30_000), _flood(unit, 300_000)
    spent = math.inf
    for _ in range(5):
        start = time.process_time()
        redact.redact_text(small)
        spent = min(spent, time.process_time() - start)
    # 10x the text in at most 30x the CPU (quadratic would be 100x: the margin is for cache
    # effects of the bigger text and a noisy neighbour on 2 cores); a second try absorbs a burst
    for attempt in range(2):
        try:
            with _cpu_budget(30 * spent):
                redact.redact_text(big)
            return
        except _TooSlow:
            continue
    pytest.fail(f"300 KB took more than 30x the CPU of 30 KB ({spent * 1000:.1f} ms)")


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
    from diagnostics.engine import execute
    import os
    import re as re_
    try:
        raise RuntimeError(f"request failed with HF_TOKEN={HF}")
    except RuntimeError as exc:
        message = execute.internal_error(exc)
    assert HF not in message and "HF_TOKEN=<redacted>" in message
    path = re_.search(r"full traceback in (\S+)", message).group(1)
    try:
        text = open(path).read()
        assert "Traceback (most recent call last)" in text and "RuntimeError" in text
        assert HF not in text
        assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    finally:
        os.unlink(path)


def test_patterns_compile_when_a_text_first_needs_them():
    import subprocess
    import sys
    code = """
import json
from diagnostics.core import redact
from diagnostics.core.lean_imports import LazyPattern
lazy = [p for p in (redact._HEAD, redact._VALUE, redact._NOT_A_SECRET_VALUE, redact._BEARER,
                    redact._PROSE_VALUE, redact._BLOCK_SCALAR, redact._COOKIE_PAIR,
                    redact._PASSWORD_COMMAND,
                    *(p for _, p, _ in redact._SHAPES), *(p for _, p in redact._TOKENS))]
before = sum(p._compiled is not None for p in lazy)
plain = redact.redact_text("all 8 GPUs healthy, 42 C")
after_plain = sum(p._compiled is not None for p in lazy)
masked = redact.redact_text("HF token: %s")
print(json.dumps({"all_lazy": all(isinstance(p, LazyPattern) for p in lazy), "n": len(lazy),
                  "before": before, "after_plain": after_plain, "plain": plain, "masked": masked,
                  "hf_compiled": redact._TOKENS[0][1]._compiled is not None}))
""" % HF
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert found["all_lazy"] and found["n"] == 26
    # importing redact compiles nothing, and a text without a needle compiles nothing either
    assert found["before"] == 0 and found["after_plain"] == 0
    assert found["plain"] == "all 8 GPUs healthy, 42 C"
    # a text that needs a pattern compiles it and is masked as before
    assert HF not in found["masked"] and redact.REDACTED in found["masked"]
    assert found["hf_compiled"]
