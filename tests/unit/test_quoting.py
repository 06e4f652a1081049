"""Invariant 1 (DESIGN.md §3): no user data on any command line; the command line survives
every login shell. Property-based: over the pure encoders, and over what ``runner.run_one``
hands the transport of each chain shape; the real-shell round trip is in
tests/integration/test_quoting_remote.py."""

import shlex
import string
from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

from diagnostics.engine import bundle, runner
from diagnostics import transport as hops
from diagnostics.transport import chain_for
from diagnostics.transport.base import ProcessOutput, Transport
from diagnostics.transport.containers import Docker, Lxc, Pct, Podman
from diagnostics.transport.slurm import SrunStep
from diagnostics.transport.ssh import SshPool, UnsafeCommand, join_checked
from diagnostics.inventory.topology import SAFE_TOKEN, Container, Slurm, SshHost, Target, is_safe_token

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


class RecordingTransport(Transport):
    """Stands where a chain's transport stands (local or ssh): keeps what the runner hands it,
    the argv and the payload, and answers as a command that printed nothing."""

    kind = "recording"

    def __init__(self):
        self.handed = []

    def run(self, argv, payload, deadline):
        self.handed.append((list(argv), payload))
        return ProcessOutput(b"", b"", 0)

    def put(self, data, path):
        raise AssertionError("the bundle is streamed through run(), never put")

    def describe(self) -> str:
        return "recording"

    def close(self) -> None:
        pass


# Every hop shape the runner builds a chain for (hops.chain_for, unchanged), as (target, the
# Slurm step of a node row or None): the transport alone is swapped for the recorder, so the
# argv checked is the one ssh or Popen would be handed.
CHAIN_SHAPES = {
    "local": (Target(name="t", local=True), None),
    "ssh": (Target(name="t", host=SshHost("gpu1", address="10.0.0.5", user="ml")), None),
    "ssh via jumps, sudo": (Target(name="t", host=SshHost("inner", jump=SshHost("jump", jump=SshHost("edge"))),
                                   become="sudo"), None),
    "sudo, pct": (Target(name="t", host=SshHost("pve"), become="sudo",
                         container=Container("pct", "200"), python="/root/venv/bin/python"), None),
    "lxc as a user": (Target(name="t", host=SshHost("h"), container=Container("lxc", "ct1", exec_user="ml")),
                      None),
    "docker": (Target(name="t", host=SshHost("h"), container=Container("docker", "c1", exec_user="ml")), None),
    "sudo, podman": (Target(name="t", host=SshHost("h"), become="sudo", container=Container("podman", "p1")),
                     None),
    "kubectl": (Target(name="t", host=SshHost("h"),
                       container=Container("kubectl", "p-0", namespace="ml", container="main")), None),
    "slurm node row, sudo, docker": (Target(name="t:node01", host=SshHost("login"), slurm=Slurm(nodes=2),
                                            become="sudo", container=Container("docker", "c1")),
                                     SrunStep("4242", "node01")),
    "activate": (Target(name="t", local=True, python="python",
                        activate=("/opt/conda/etc/profile.d/conda.sh", "conda", "activate", "train")), None),
}


def handed_to_the_transport(target, step, job):
    """(argv, payload) that ``runner.run_one`` hands the transport of ``target``'s real chain."""
    transport = RecordingTransport()

    def recording_chain(t, pool, step=None):
        chain = chain_for(t, pool, step)
        chain.transport = transport
        return chain

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runner, "chain_for", recording_chain)
        patch.setattr(hops, "resolve", lambda host: None)   # no `ssh -G`: nothing connects
        runner.run_one(target, job, SshPool(), step=step)
    [(argv, payload)] = transport.handed
    return argv, payload


user_env = st.dictionaries(st.text(min_size=1), st.text(), max_size=4)
file_names = st.one_of(st.sampled_from(["s.py", "a b.py", "$(id).py", "-c.py", "ü`x`.py"]),
                       st.text(min_size=1, max_size=20))


@settings(max_examples=40, deadline=None)
@given(argv_lists, user_env, file_names, st.binary(max_size=64),
       st.dictionaries(st.text(min_size=1, max_size=12), st.binary(max_size=16), max_size=2))
def test_the_command_line_never_holds_user_data(argv, env, script_name, source, put_files):
    """Whatever the script's name, source, arguments, env and --put files, every chain hands its
    transport the same constant argv it hands for an empty job, and all of them ride in the
    payload (read back here as the target reads it)."""
    put_files = {k: v for k, v in put_files.items() if k != script_name}
    job = bundle.Job("run-script", script_name, source, argv=tuple(argv), mode="script",
                     extra_files=put_files)
    empty = bundle.Job("run-script", "s.py", b"", mode="script")
    user_strings = [*argv, *env, *env.values(), script_name, *put_files]
    for shape, (target, step) in CHAIN_SHAPES.items():
        constant, _ = handed_to_the_transport(target, step, empty)
        argv_sent, payload = handed_to_the_transport(replace(target, env=tuple(env.items())), step, job)
        assert argv_sent == constant, shape
        line = join_checked(argv_sent)          # what the ssh transport sends, checked as it is
        for value in user_strings:
            if len(value) > 3 and not is_safe_token(value):
                assert value not in line, (shape, value)
        _, _, header, files = bundle.parse_payload(payload)
        assert (header["argv"], header["env"], header["script"]) == (argv, env, script_name), shape
        assert files == {script_name: source, **put_files}, shape


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
