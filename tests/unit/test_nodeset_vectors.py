"""Pin the ClusterShell node-set behaviour render.py relies on, with ClusterShell's own vectors.

tests/fixtures/nodeset/clustershell-vectors.json (see the README there: taken from
cea-hpc/clustershell's test suite, LGPL-2.1-or-later) holds lists of vectors:
``fold`` ({nodes, folded}), ``expand`` ({pattern, nodes}), ``normalize``
({pattern, folded}) and ``invalid`` / ``invalid_with_step`` ({pattern, error}).
The ``*_with_step`` fold/expand lists exercise autostep, which we do not use.
"""

import json
from pathlib import Path

import pytest
from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet

from diagnostics.views.render import fold_names

VECTORS = json.loads((Path(__file__).parent.parent / "fixtures" / "nodeset"
                      / "clustershell-vectors.json").read_text(encoding="utf-8"))


# NOTE: bigcluster[1-1000000] and a 122k-node pattern: ClusterShell's str() of them takes
# seconds, and sets that size are not a case for a results table.
HUGE = {"bigcluster[1-1000000]", "[01230-99999,100000-123100]L6"}


def cases(kind):
    vectors = [(i, v) for i, v in enumerate(VECTORS[kind]) if v.get("pattern") not in HUGE]
    return pytest.mark.parametrize("v", [v for _, v in vectors],
                                   ids=[f"{v['src']}:{i}" for i, v in vectors])


def expand(pattern):
    return list(NodeSet(pattern, resolver=RESOLVER_NOGROUP))


def test_vector_lists_are_there():
    for kind in ("fold", "expand", "normalize", "invalid", "invalid_with_step"):
        assert VECTORS[kind], kind
    assert sum(v.get("pattern") in HUGE for v in VECTORS["normalize"]) == len(HUGE)


@cases("fold")
def test_fold_vectors(v):
    """Our folding path gives ClusterShell's asserted folded string, and it reads back."""
    folded = fold_names(v["nodes"])
    assert folded == v["folded"]
    assert set(expand(folded)) == set(v["nodes"])


@cases("expand")
def test_expand_vectors(v):
    """Expansion order and content; folding the expansion gives the normalised pattern back."""
    nodes = expand(v["pattern"])
    assert nodes == v["nodes"]
    if "len" in v:
        assert len(nodes) == v["len"]
    assert fold_names(nodes) == str(NodeSet(v["pattern"], resolver=RESOLVER_NOGROUP))
    assert expand(fold_names(nodes)) == nodes


@cases("normalize")
def test_normalize_vectors(v):
    """Pattern → canonical string. Folding the expansion name by name reads back as the same
    set, but need not be the same string: ``n-1`` alone is a plain name, so ``n[-1-0]``
    expanded and refolded is ``n0,n-1``."""
    ns = NodeSet(v["pattern"], resolver=RESOLVER_NOGROUP)
    assert str(ns) == v["folded"]
    if "len" in v:
        assert len(ns) == v["len"]
    assert set(expand(fold_names(list(ns)))) == set(ns)


@cases("invalid")
def test_invalid_vectors(v):
    """ClusterShell rejects the pattern; as a target name it is shown as is, not folded."""
    with pytest.raises(Exception) as info:
        NodeSet(v["pattern"], resolver=RESOLVER_NOGROUP)
    assert type(info.value).__name__ == v["error"]
    assert fold_names([v["pattern"]]) == v["pattern"]


@cases("invalid_with_step")
def test_invalid_with_step_vectors(v):
    with pytest.raises(Exception) as info:
        NodeSet(v["pattern"], resolver=RESOLVER_NOGROUP)
    assert type(info.value).__name__ == v["error"]
    assert fold_names([v["pattern"]]) == v["pattern"]
