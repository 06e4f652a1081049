"""Invariant 1 (DESIGN.md §3): no user data on any command line; the command line survives
every login shell. Property-based over the pure encoders; the real-shell round trip is in
tests/integration/test_quoting_remote.py."""

import shlex
import string

from hypothesis import given, settings, strategies as st

from diagnostics import bundle
from diagnostics.hops import Chain, Interpreter
from diagnostics.hops.containers import Docker, Kubectl, Lxc, Pct, Podman
from diagnostics.hops.ssh import UnsafeCommand, join_checked
from diagnostics.hops.sudo import Sudo
from diagnostics.topology import SAFE_TOKEN, Target, is_safe_token

NASTY = ["'", '"', "$(id)", "`id`", "{a,b}", "*", "?", "[ab]", "=ls", "~root", "\n", "", "-c",
         "--json", "ü", "\\", ";", "|", "&", "!", "#", "%", " ", "\t", "\x00"[:0], "${HOME}",
         "a b", "l1\nl2", "-", "--", ">x", "<y", "(", ")", "^", "\r"]
nasty_text = st.one_of(st.sampled_from(NASTY), st.text(), st.text(alphabet=string.printable))
argv_lists = st.lists(st.one_of(nasty_text, st.builds("".join, st.lists(st.sampled_from(NASTY)))),
                      max_size=12)
safe_tokens = st.from_regex(SAFE_TOKEN, fullmatch=True)


def job(argv, env=None):
    return bundle.Job("run-script", "s.py", b"print(1)", argv=tuple(argv), mode="script")


@given(argv_lists, st.dictionaries(st.text(min_size=1), st.text(), max_size=4))
def test_user_argv_and_env_travel_in_the_payload_byte_for_byte(argv, env):
    j = job(argv)
    header = bundle.build_header(j, target="t", timeout=5, env=env, activate=[], python="python3",
                                 nonce="ab")
    stage_a, runtime, decoded, files = bundle.parse_payload(bundle.build_payload(header, bundle.job_files(j)))
    assert decoded["argv"] == argv
    assert decoded["env"] == env
    assert files == {"s.py": b"print(1)"}
    assert stage_a == bundle.STAGE_A


@given(argv_lists)
def test_the_command_line_never_holds_user_data(argv):
    """Whatever the script's arguments, the argv sent to any chain is the same constant one."""
    for chain_wrappers in ([], [Sudo()], [Sudo(), Pct("200")], [Docker("c1", "ml")],
                           [Kubectl("p-0", namespace="ml", container="main")]):
        chain = Chain(Target(name="t"), transport=None, wrappers=chain_wrappers,
                      interpreter=Interpreter("/root/venv/bin/python"))
        line = join_checked(chain.argv())
        for arg in argv:
            if len(arg) > 3 and not is_safe_token(arg):
                assert arg not in line


@given(st.lists(st.one_of(safe_tokens, st.just(bundle.BOOT)), min_size=1, max_size=10))
def test_safe_tokens_round_trip_through_a_posix_shell_split(tokens):
    line = join_checked(tokens)
    assert shlex.split(line) == tokens


@given(st.lists(st.text(), min_size=1, max_size=6))
def test_any_token_outside_the_alphabet_is_refused_before_sending(tokens):
    if all(t == bundle.BOOT or is_safe_token(t) for t in tokens):
        assert shlex.split(join_checked(tokens)) == tokens
    else:
        try:
            join_checked(tokens)
        except UnsafeCommand as exc:
            assert "outside the safe alphabet" in str(exc)
        else:
            raise AssertionError("an unsafe token was accepted")


@given(safe_tokens)
def test_no_safe_token_starts_with_a_zsh_expansion(token):
    assert token[0] not in "=~"
    assert not set(token) & set("'\"\\!$`\n*?[]{}();|&<> \t#")


def test_boot_is_inert_inside_single_quotes_in_every_shell():
    assert not set(bundle.BOOT) & set("'\"\\!$`\n")
    assert shlex.join(["python3", "-c", bundle.BOOT]) == f"python3 -c '{bundle.BOOT}'"


@settings(max_examples=50)
@given(st.sampled_from([Pct, Lxc, Docker, Podman]), safe_tokens, st.one_of(st.none(), safe_tokens))
def test_container_hops_pass_argv_through_unchanged(cls, cid, user):
    inner = ["python3", "-c", bundle.BOOT]
    wrapped = cls(cid, user).wrap(inner)
    assert wrapped[-3:] == inner
    assert cid in wrapped
