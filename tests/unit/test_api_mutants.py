"""diagnostics/api.py, in this process (mutmut-registry.cfg): the options ``api.run`` hands the
engine are the ones ``mldiag TASK`` builds from the same flags (but --json, and quiet), with the
``mldiag`` config's defaults; which registry it looks a task up in; the decorator's flags,
help, config default and exits.

The engine itself is replaced by a recorder where the options are the subject (a task's own
run is tests/unit/test_api.py's, on the local target)."""

from dataclasses import replace

import pytest
from invoke import Config, Context, Exit

from diagnostics import builtin
from diagnostics import api
from diagnostics.engine import execute, registry, team
from diagnostics.builtin import BUILTIN
from diagnostics.core.outcome import Outcome
from diagnostics.cli.tasks import COMMON_HELP, diagnostic_task


@pytest.fixture
def engine(monkeypatch):
    """``execute.run_diagnostic`` recorded: each call's spec, options and values; it prints nothing
    and says ``said``."""
    calls = []

    def run_diagnostic(spec, opts, values, out=None):
        calls.append((spec, opts, dict(values)))
        return Outcome([], 0, ("said",))
    monkeypatch.setattr(execute, "run_diagnostic", run_diagnostic)
    return calls


def by_the_task(engine, spec, context, **flags):
    """The options ``mldiag TASK`` builds from ``flags`` (its task's own body)."""
    diagnostic_task(spec).body(context, **flags)
    return engine.pop()


CONFIGURED = {"mldiag": {"hosts_file": "/configured/hosts.yaml", "parallel": 5, "timeout": 30}}


def test_run_hands_the_engine_the_command_lines_options_with_json_and_quiet(engine):
    spec = registry.get("scan-log")
    got = api.run("scan-log", hosts=("a", "b"), group="gpus", hosts_file="/h.yaml", parallel=3,
                  timeout=7.5, keep_remote=True, save="/out", path="/var/log/x", lines=5)
    assert (got.documents, got.status, got.exit_code, got.messages) == ([], "ok", 0, ("said",))
    [(given_spec, opts, values)] = engine
    assert given_spec is spec and values == {"path": "/var/log/x", "lines": 5}
    assert opts == execute.Options(host=["a", "b"], group=["gpus"], hosts_file="/h.yaml", json=True,
                               save="/out", parallel="3", timeout="7.5", keep_remote=True,
                               quiet=True)
    _, task_opts, task_values = by_the_task(engine, spec, Context(), path="/var/log/x", lines=5,
                                            host=["a", "b"], group=["gpus"], hosts_file="/h.yaml",
                                            save="/out", parallel="3", timeout="7.5",
                                            keep_remote=True)
    assert opts == replace(task_opts, json=True, quiet=True) and values == task_values


def test_run_with_nothing_given_runs_on_the_defaults(engine):
    api.run("ping")
    [(_, opts, values)] = engine
    assert opts == execute.Options(host=[], group=[], json=True, quiet=True) and values == {}


@pytest.mark.parametrize("config", [Context(Config(overrides=CONFIGURED)),
                                    Config(overrides=CONFIGURED), CONFIGURED],
                         ids=["context", "config", "dict"])
def test_run_takes_the_mldiag_configs_defaults_from_a_context_or_a_config(engine, config):
    api.run("ping", hosts="box", config=config)
    api.run("ping", hosts="box", config=config, hosts_file="/h.yaml", parallel=2, timeout=9)
    configured, given = [opts for _, opts, _ in engine]
    assert (configured.hosts_file, configured.parallel, configured.timeout) == \
        ("/configured/hosts.yaml", "5", "30")
    assert (given.hosts_file, given.parallel, given.timeout) == ("/h.yaml", "2", "9")
    assert configured.host == ["box"] and configured.group == []


def test_a_task_without_flags_says_none(engine):
    with pytest.raises(api.ApiError) as caught:
        api.run("ping", colour="red")
    assert (str(caught.value), caught.value.exit_code) == ("ping: no flag 'colour' (its flags: "
                                                           "none)", 4)
    assert engine == []


def test_run_finds_a_team_task_in_this_runs_registry_before_the_hosts_file(engine, checks,
                                                                           tmp_path):
    directory, _ = checks
    plain = tmp_path / "plain.yaml"
    plain.write_text("hosts:\n  here: {local: true}\n")
    registry.use(team.discover(BUILTIN, str(plain), [str(directory)], entry_points=False))
    api.run("probe", hosts_file=str(plain), level="warn")
    [(spec, opts, values)] = engine
    assert (spec.name, spec.builtin, values) == ("probe", False, {"level": "warn"})


def test_registry_for_and_collection_read_the_diagnostics_dirs(checks, tmp_path):
    directory, _ = checks
    plain = tmp_path / "plain.yaml"
    plain.write_text("hosts:\n  here: {local: true}\n")
    found = api.registry_for(str(plain), [str(directory)])
    assert "probe" in found.specs and registry.current() is found
    registry.use(builtin.BUILTIN)
    assert "probe" in api.collection(str(plain), [str(directory)]).tasks
    assert "probe" not in api.collection(str(plain)).tasks


def test_worst_of_no_runs_is_ok():
    assert api.worst() == 0


# ---------------------------------------------------------------------------- @api.task

def test_the_decorator_gives_mldiags_help_for_the_target_flags_and_passes_invoke_options():
    @api.task
    def plain(c):
        return None

    @api.task(aliases=["pf"], help={"level": "the level", "host": "where"})
    def with_options(c, level="ok"):
        return None
    assert plain.help == {"host": COMMON_HELP["host"], "group": COMMON_HELP["group"],
                          "hosts-file": COMMON_HELP["hosts-file"]}
    assert with_options.help == {"host": "where", "group": COMMON_HELP["group"],
                                 "hosts-file": COMMON_HELP["hosts-file"], "level": "the level"}
    assert with_options.aliases == ["pf"] and plain.aliases == ()
    assert plain.__module__ == __name__ == with_options.body.__module__


def test_the_decorated_function_gets_the_configured_hosts_file_unless_given():
    seen = []

    @api.task
    def where(c, hosts_file=None):
        seen.append(hosts_file)
        return 0
    configured = Context(Config(overrides=CONFIGURED))
    assert where(configured) == 0
    assert where(configured, hosts_file="/given.yaml") == 0
    assert where(Context()) == 0
    assert seen == ["/configured/hosts.yaml", "/given.yaml", None]


@pytest.mark.parametrize("returned, code", [(3, 3), (0, None), (None, None), (True, None),
                                            ("text", None)])
def test_a_returned_int_is_the_exit_code(returned, code):
    @api.task
    def ends(c):
        return returned
    if code is None:
        assert ends(Context()) is returned
    else:
        with pytest.raises(Exit) as ended:
            ends(Context())
        assert ended.value.code == code
