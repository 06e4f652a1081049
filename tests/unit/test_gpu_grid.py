"""Issue 11 item 3: gpu-status over a fleet as a node × GPU grid with a legend.

The fleet is 16 nodes: 15 local targets, each answered by the fake nvidia-smi from a recorded
capture (derived captures inject the faults) and reading its own saved kernel log, plus one
dead host (an SSH target on a closed port). It runs through the real ``mldiag`` on a real
terminal (tests/terminal.py: tmux), through a pipe, and with NO_COLOR.
"""

import io
import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from diagnostics.builtin.gpu_status import grid as gpu_grid
from diagnostics.views import render
from diagnostics.builtin.gpu_status import view as gpu_view
from diagnostics.core.results import ErrorInfo, Finding, Result
from tests.programs import REPO, mldiag
from tests.terminal import mldiag_screen

SGR = re.compile("\x1b\\[[0-9;]*m")


def grid(results, color=False):
    out = io.StringIO()
    gpu_grid.render_grid(results, out, color=color)
    return out.getvalue()


def node(target, n=8, findings=(), status="ok", **data):
    data.setdefault("gpus", [{"index": i, "name": "NVIDIA H200"} for i in range(n)])
    return Result("gpu-status", target, status, "s", findings=list(findings), data=data)


# --------------------------------------------------------------------------- the grid itself


def test_cells_are_marked_by_each_gpus_worst_finding_and_rows_fold():
    results = [
        node("n1"), node("n2"), node("n4"),
        node("n3", status="fail", findings=[
            Finding("info", "gpu-busy", "GPUs 0-7 busy: ...", gpus=list(range(8))),
            Finding("fail", "ecc-uncorrectable", "GPU 5: ...", gpus=[5]),
            Finding("warn", "ecc-uncorrectable-history", "GPU 2: ...", gpus=[2]),
            Finding("warn", "remap-pending", "GPU 5: ...", gpus=[5]),   # GPU 5's worst is the fail
            Finding("fail", "gpu-count-low", "7 of 8 GPUs visible")]),  # no GPU: the node's alone
        node("n5", n=4),
        Result.failure("gpu-status", "n6", "unreachable", "connect to 10.0.0.6:22: Connection refused"),
    ]
    assert grid(results) == (
        "\n"
        "NODES     GPU 0 1 2 3 4 5 6 7\n"
        "n[1-2,4]      . . . . . . . .\n"
        "n3            . . e . . E . .\n"
        "n5            . . . . - - - -\n"
        "n6            not checked: unreachable\n"
        "\n"
        "Legend:\n"
        "  E  fail   ecc-uncorrectable: uncorrectable ECC errors since the driver loaded\n"
        "  e  warn   ecc-uncorrectable-history: uncorrectable ECC errors in its lifetime count\n"
        "  .  ok     no finding above info\n"
        "  -         no GPU at this index\n")


def test_colour_follows_the_tables_statuses_and_the_marks_read_without_it():
    results = [node("a", n=4, findings=[Finding("fail", "gpu-lost", "GPU 3 ...", gpus=[3]),
                                        Finding("warn", "xid", "Xid 13 ...", gpus=[1])]),
               Result.failure("gpu-status", "b", "timeout", "ran past 300 s")]
    painted = grid(results, color=True)
    assert painted == (
        "\n"
        "NODES  GPU 0 1 2 3\n"
        "a          \x1b[32m.\x1b[0m \x1b[33mx\x1b[0m \x1b[32m.\x1b[0m \x1b[31mL\x1b[0m\n"
        "b          \x1b[1;31mnot checked: timeout\x1b[0m\n"
        "\n"
        "Legend:\n"
        "  \x1b[31mL\x1b[0m  fail   gpu-lost: the GPU is lost (fallen off the bus)\n"
        "  \x1b[33mx\x1b[0m  warn   xid: an Xid in the kernel log\n"
        "  \x1b[32m.\x1b[0m  ok     no finding above info\n")
    assert SGR.sub("", painted) == grid(results)


def test_sixteen_gpus_keep_their_columns_and_dead_nodes_alone_need_no_legend():
    big = node("big", n=16, findings=[Finding("fail", "gpu-lost", "GPU 11 ...", gpus=[11])])
    assert grid([big, node("small")]) == (
        "\n"
        "NODES  GPU 0  1  2  3  4  5  6  7  8  9  10 11 12 13 14 15\n"
        "big        .  .  .  .  .  .  .  .  .  .  .  L  .  .  .  .\n"
        "small      .  .  .  .  .  .  .  .  -  -  -  -  -  -  -  -\n"
        "\n"
        "Legend:\n"
        "  L  fail   gpu-lost: the GPU is lost (fallen off the bus)\n"
        "  .  ok     no finding above info\n"
        "  -         no GPU at this index\n")
    dead = [Result.failure("gpu-status", "a", "unreachable", "x"), Result.failure("gpu-status", "b", "auth", "x")]
    assert grid(dead) == "\nNODES  GPU\na          not checked: unreachable\nb          not checked: auth\n"


def test_an_unreadable_gpu_is_an_error_whatever_else_is_said_of_it():
    r = node("a", n=0, gpus=[{"index": 0}, {"index": 1, "error": "expected 37 columns, got 3"}],
             lost_gpus=[{"index": 2, "pci_bus_id": "0000:BA:00.0", "error": "GPU is lost"}],
             findings=[Finding("warn", "gpu-row-error", "GPU 1 could not be read", gpus=[1]),
                       Finding("fail", "xid-fatal", "Xid 79", gpus=[1, 2])])
    assert grid([r, node("b", n=3)]).splitlines()[2:] == [
        "a          . ! X",
        "b          . . .",
        "",
        "Legend:",
        "  !  error  gpu-row-error: the GPU's row could not be read",
        "  X  fail   xid-fatal: an Xid in the kernel log that needs a GPU reset or a reboot",
        "  .  ok     no finding above info",
    ]


def test_two_codes_never_share_a_mark():
    findings = [Finding("fail", "xid-fatal", "", gpus=[0]), Finding("fail", "x-other", "", gpus=[1]),
                Finding("fail", "xylophone", "", gpus=[2]), Finding("warn", "xid", "", gpus=[3])]
    marks = gpu_grid.assign_marks([gpu_grid.node_row(node("a", findings=findings))])
    assert marks == {(2, "x-other"): "O", (2, "xid-fatal"): "X", (2, "xylophone"): "Y", (1, "xid"): "x"}
    many = [Finding("fail", "z%02d" % i, "", gpus=[i]) for i in range(40)]
    marks = gpu_grid.assign_marks([gpu_grid.node_row(node("a", n=40, findings=many))])
    letters = [m for m in marks.values() if m != gpu_grid.OTHER]
    assert len(letters) == len(set(letters)) == 26 and list(marks.values()).count("*") == 14
    text = grid([node("a", n=40, findings=many), node("b")])
    assert "  *  fail   another finding (the table above says which)" in text


def test_one_target_keeps_its_rows_several_get_the_grid():
    one, two = io.StringIO(), io.StringIO()
    gpu_view.render_gpus([node("a", n=2)], one)
    gpu_view.render_gpus([node("a", n=2), node("b", n=2)], two)
    assert one.getvalue().splitlines()[1].startswith("TARGET  GPU  NAME")
    assert two.getvalue().splitlines()[1] == "NODES  GPU 0 1"


# --------------------------------------------------------------------------- hostile targets

JUNK = [None, True, -1, 64, 10 ** 30, 2.0, "3", [4], {"index": 5}, "\x1b[2J"]


def test_any_json_a_target_sends_is_a_row_never_a_crash():
    results = [
        node("junk", gpus=[7, "x", None, [1], {"index": "0"}, {"index": True}, {"index": 10 ** 9},
                           {"index": 2, "error": ["a"]}, {"index": 3, "error": "\x1b]0;t\x07"}]),
        node("notalist", gpus="\x1b[2J", lost_gpus={"index": 1}),
        node("codes", n=2, findings=[Finding("fail", "\x1b]0;owned\x07\u202e" + "c" * 500, "m", gpus=[0]),
                                     Finding(["lvl"], 7, None, gpus=JUNK),
                                     Finding("\x1b[31m", "odd-level", "m", gpus=[1]),
                                     Finding("fail", "gpus-not-a-list", "m", gpus="01")]),
        Result("gpu-status", "data\u202e", "warn", "s", data=["x"]),
        Result("gpu-status", "err", "error", "s", error=ErrorInfo("\x1b[2J", "t", "m")),
    ]
    text = grid(results)
    assert [ch for ch in text if render.UNSAFE.match(ch) and ch != "\n"] == []
    lines = text.splitlines()
    assert lines[1] == "NODES       GPU 0 1 2 3"
    assert "codes           X O - -" in lines      # an unknown level ranks as an error (core/results.py)
    assert "data\\u202e      no GPUs seen" in lines
    assert "err             not checked: \\x1b[2J" in lines
    assert "junk            - - ! !  (+7 GPUs without an index to draw)" in lines
    assert "notalist        no GPUs seen" in lines
    legend = lines[lines.index("Legend:") + 1:]
    assert any(line.startswith("  X  fail   \\x1b]0;owned\\x07\\u202eccc") and len(line) < 100
               for line in legend), legend


FINDING = st.fixed_dictionaries({"level": st.sampled_from(["info", "warn", "fail", "error", "odd"]),
                                 "code": st.text(max_size=6), "message": st.text(max_size=4)},
                                optional={"gpus": st.one_of(st.lists(st.one_of(
                                    st.integers(-2, 70), st.booleans(), st.none(), st.text(max_size=2),
                                    st.floats()), max_size=4), st.text(max_size=3), st.integers())})
GPU = st.one_of(st.none(), st.integers(), st.text(max_size=3),
                st.fixed_dictionaries({}, optional={"index": st.one_of(st.integers(-2, 70), st.text(max_size=2),
                                                                      st.floats(), st.booleans()),
                                                    "error": st.one_of(st.none(), st.text(max_size=3),
                                                                       st.lists(st.integers(), max_size=2))}))


@settings(max_examples=300, deadline=None)
@given(docs=st.lists(st.fixed_dictionaries({
    "target": st.text(max_size=6),
    "status": st.sampled_from(["ok", "warn", "fail", "error"]),
    "findings": st.lists(FINDING, max_size=4),
    "data": st.one_of(st.fixed_dictionaries({}, optional={"gpus": st.one_of(st.lists(GPU, max_size=5),
                                                                            st.text(max_size=3)),
                                                          "lost_gpus": st.lists(GPU, max_size=2)}),
                      st.lists(st.integers(), max_size=2))}), min_size=2, max_size=5),
       color=st.booleans())
def test_the_grid_takes_any_results(docs, color):
    """Hypothesis: whatever findings (``gpus`` of any shape) and data the targets send, the grid
    is drawn, holds no control character of theirs, and every mark it shows is in the legend."""
    results = [Result.from_dict(dict(d, summary="s", error=None)) for d in docs]
    text = grid(results, color=color)
    plain = SGR.sub("", text)
    assert [ch for ch in plain if render.UNSAFE.match(ch) and ch != "\n"] == []
    lines = plain.splitlines()
    assert lines[1].startswith("NODES")
    explained = {line[2] for line in lines[lines.index("Legend:") + 1:]} if "Legend:" in lines else set()
    body = lines[2:lines.index("", 2) if "" in lines[2:] else len(lines)]
    assert body, plain
    width = len(lines[1].split("GPU", 1)[0]) + 4
    for line in body:
        cells = line[width:].split("  (+")[0]
        if cells.startswith(("not checked", "no GPUs seen")):
            continue
        assert set(cells.replace(" ", "")) <= explained, (line, explained)


# --------------------------------------------------------------------------- a recorded fleet

CAPTURES = {   # node: (derived capture, phase)
    3: ("derived__h200x8__ecc-uncorrectable", "idle"),
    5: ("derived__h200x8__gpu-lost", "idle"),
    9: ("derived__h200x8__hw-thermal-slowdown", "load"),
    11: ("derived__h200x8__busy-pid-4242", "idle"),
    12: ("derived__h200x8__pid-namespace", "idle"),
}
KERNEL_LOGS = {   # node: its saved dmesg (the Xid lines as the NVIDIA driver prints them)
    5: "[ 812.003] NVRM: Xid (PCI:0000:ba:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n",
    7: "[1212.500] NVRM: Xid (PCI:0000:5d:00): 13, pid=4242, name=python, Graphics Exception\n",
    14: "[  33.100] NVRM: Xid (PCI:0000:2a:00): 48, pid='<unknown>', name=<unknown>, DBE\n",
}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """hosts.yaml of node[01-16]: each node a local target with 8 GPUs whose private temp dir
    lies in a directory of its own, beside its kernel log (``--kernel-log-file ../kern.log`` is
    then each node's own); node16 an SSH host on a port nobody listens on."""
    root = tmp_path_factory.mktemp("fleet")
    fakes = Path(REPO) / "tests" / "fakes"
    lines = ["hosts:"]
    for n in range(1, 16):
        capture, phase = CAPTURES.get(n, ("derived__h200x8__healthy", "idle"))
        home = root / f"node{n:02d}"
        home.mkdir(mode=0o700)
        (home / "kern.log").write_text(KERNEL_LOGS.get(n, ""))
        lines.append(f"  node{n:02d}: {{local: true, gpus: 8, tmpdir: {home}, env: {{PATH: \"{fakes}:/usr/bin:/bin\", "
                     f"MLDIAG_FAKE_NVIDIA_SMI: {capture}, MLDIAG_FAKE_NVIDIA_SMI_PHASE: {phase}}}}}")
    lines.append("  node16: {address: 127.0.0.1, port: 1, gpus: 8, connect_timeout: 5}")
    (root / "hosts.yaml").write_text("\n".join(lines) + "\n")
    return root


FLEET_ARGV = ("gpu-status", "-H", "node[01-16]", "--kernel-log-file", "../kern.log")

# The grid as a user sees it after the table, and the summary line.
GRID = """\
NODES                          GPU 0 1 2 3 4 5 6 7
node[01-02,04,06,08,10-13,15]      . . . . . . . .
node03                             . . e . . E . .
node05                             . . . . . . L .
node07                             . . . x . . . .
node09                             . . T . . . . .
node14                             . X . . . . . .
node16                             not checked: unreachable

Legend:
  T  fail   clocks-hw-thermal: HW thermal slowdown
  E  fail   ecc-uncorrectable: uncorrectable ECC errors since the driver loaded
  L  fail   gpu-lost: the GPU is lost (fallen off the bus)
  X  fail   xid-fatal: an Xid in the kernel log that needs a GPU reset or a reboot
  e  warn   ecc-uncorrectable-history: uncorrectable ECC errors in its lifetime count
  x  warn   xid: an Xid in the kernel log
  .  ok     no finding above info

10 ok \N{MIDDLE DOT} 1 warn \N{MIDDLE DOT} 4 fail \N{MIDDLE DOT} 1 error (unreachable)
"""


def grid_part(text):
    """From the grid's header to the end."""
    start = text.index("NODES ")
    assert text[:start].endswith("\n\n"), text   # the table, a blank line, then the grid
    return text[start:]


def on_screen(fleet, env=None):
    with mldiag_screen(*FLEET_ARGV, cwd=fleet, env=env, width=250, height=80) as screen:
        status = screen.wait_exit(120)
        return status, screen.text(), screen.text(escapes=True)


def colours(escaped):
    """The screen with each coloured character replaced by its colour -- g green, y yellow,
    r red, R bold red -- from the SGR codes tmux gives back (a tiny SGR reader: 0 and 39 end a
    colour, 1 and 22 set and end bold); blanks and uncoloured characters as they are."""
    out, fg, bold, i = [], None, False, 0
    for m in re.finditer(r"\x1b\[([0-9;]*)m|(.)", escaped, re.S):
        if m.group(2) is None:
            for p in (m.group(1) or "0").split(";"):
                p = int(p or 0)
                if p == 0:
                    fg, bold = None, False
                elif p == 1:
                    bold = True
                elif p == 22:
                    bold = False
                elif 30 <= p <= 37 or p == 39:
                    fg = None if p == 39 else p
            continue
        ch = m.group(2)
        letter = {32: "g", 33: "y", 31: "R" if bold else "r"}.get(fg)
        out.append(letter if letter and not ch.isspace() else ch)
    return "".join(out)


# The grid and legend in colour: each mark is its status's colour, as in the table.
GRID_COLOURS = """\
NODES                          GPU 0 1 2 3 4 5 6 7
node[01-02,04,06,08,10-13,15]      g g g g g g g g
node03                             g g y g g r g g
node05                             g g g g g g r g
node07                             g g g y g g g g
node09                             g g r g g g g g
node14                             g r g g g g g g
node16                             RRR RRRRRRRR RRRRRRRRRRR

Legend:
  r  fail   clocks-hw-thermal: HW thermal slowdown
  r  fail   ecc-uncorrectable: uncorrectable ECC errors since the driver loaded
  r  fail   gpu-lost: the GPU is lost (fallen off the bus)
  r  fail   xid-fatal: an Xid in the kernel log that needs a GPU reset or a reboot
  y  warn   ecc-uncorrectable-history: uncorrectable ECC errors in its lifetime count
  y  warn   xid: an Xid in the kernel log
  g  ok     no finding above info
"""


def test_the_fleet_grid_on_a_terminal_in_colour(fleet):
    status, text, escaped = on_screen(fleet)
    assert status == 3, text
    assert grid_part(text) == GRID
    painted = grid_part(colours(escaped))
    assert painted[:painted.index("\n\n10 ok")+1] == GRID_COLOURS, painted
    assert colours("\x1b[1;31mab\x1b[22m c\x1b[0md\x1b[33me\x1b[39mf") == "RR rdyf"


def test_the_fleet_grid_through_a_pipe_and_with_no_color(fleet):
    piped = mldiag(*FLEET_ARGV, cwd=fleet)
    assert piped.returncode == 3, piped.stdout + piped.stderr
    assert "\x1b" not in piped.stdout + piped.stderr
    assert grid_part(piped.stdout) == GRID
    status, text, escaped = on_screen(fleet, env={"NO_COLOR": "1"})
    assert status == 3 and grid_part(text) == GRID
    assert "\x1b[" not in escaped.replace("\x1b[0m", "").replace("\x1b[m", ""), escaped
    # --json keeps the folded findings' GPUs
    docs = json.loads(mldiag(*FLEET_ARGV, "--json", cwd=fleet).stdout)
    by_target = {d["target"]: d for d in docs}
    assert [(f["code"], f["gpus"]) for f in by_target["node05"]["findings"] if "gpus" in f] == \
        [("gpu-lost", [6]), ("xid-fatal", [6])]
    (unattributed,) = by_target["node12"]["findings"]
    assert unattributed["gpus"] == list(range(8)) and unattributed["message"].startswith("GPUs 0-7: 60 GiB")
