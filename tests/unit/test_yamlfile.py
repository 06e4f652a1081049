"""The line-tracking YAML loader and its value checks (diagnostics/inventory/yamlfile.py), directly:
the edges that hosts.yaml and runbook tests do not reach (found by mutation testing, see
setup.cfg)."""

import pytest
import yaml

from diagnostics.inventory import yamlfile
from diagnostics.core.errors import InputError
from diagnostics.inventory.yamlfile import At


def test_a_yaml_error_without_a_mark_or_message_is_still_a_clear_input_error():
    # PyYAML's parser always marks its errors; this branch keeps a bare one from crashing.
    error = yamlfile._yaml_error(yaml.MarkedYAMLError(), "f.yaml")
    assert isinstance(error, InputError)
    assert error.line is None
    assert str(error) == "f.yaml: invalid YAML: malformed document"


def test_a_choice_error_lists_the_options_comma_separated():
    check = yamlfile.expect_choice(["pct", "docker"])
    at = At("f.yaml", 3, "runtime")
    assert check("pct", at) == "pct"
    with pytest.raises(InputError) as caught:
        check("ptc", at)
    assert str(caught.value) == "f.yaml:3: runtime: 'ptc' is not one of pct, docker"
    with pytest.raises(InputError) as caught:
        check(7, at)
    assert str(caught.value) == "f.yaml:3: runtime: expected one of pct, docker, got 7"


def test_metadata_keys_are_never_constructed():
    # an x-* value is dropped before construction: a tag there is not refused
    assert yamlfile.parse("x-meta: !custom {a: 1, a: 2}\nhosts: {}\n", "f.yaml") == {"hosts": {}}
    with pytest.raises(InputError, match=r"^f\.yaml:1: invalid YAML: tag '!custom' is not allowed"):
        yamlfile.parse("meta: !custom x\n", "f.yaml")


def test_show_cuts_a_value_past_80_characters():
    assert yamlfile.show("a" * 78) == repr("a" * 78)                 # 80 characters: whole
    assert yamlfile.show("a" * 79) == "'" + "a" * 75 + "..."         # 81: 76 and "..."


def test_bounds_are_inclusive():
    at = At("f.yaml", 1, "k")
    assert yamlfile.expect_port(65535, at) == 65535
    assert yamlfile.expect_port(1, at) == 1
    assert yamlfile.expect_seconds(0.5, at) == 0.5
    with pytest.raises(InputError, match=r"expected an integer from 1 to 65535, got 65536$"):
        yamlfile.expect_port(65536, at)


def error(text):
    with pytest.raises(InputError) as caught:
        yamlfile.parse(text, "f.yaml")
    return str(caught.value)


@pytest.mark.parametrize("text,message", [
    ("", "f.yaml:1: empty file"),
    ("\n\nb: \x01\n", "f.yaml:3: invalid YAML: control characters are not allowed (character #x0001)"),
    ("\n\na: \ud800\n", "f.yaml:3: invalid YAML: surrogates not allowed"),
    ("a: !!int abc\n", "f.yaml:1: invalid YAML: 'abc' is not a valid tag:yaml.org,2002:int"),
    ("a: 1\n? [k]\n: 1\n", "f.yaml:2: invalid YAML: found unhashable key (while constructing a "
                           "mapping at line 1)"),
    ("a: &x 1\nb:\n  <<: *x\n", "f.yaml:1: invalid YAML: expected a mapping or list of mappings "
                                "for merging, but found scalar (while constructing a mapping at "
                                "line 3)"),
    # duplicates are found after a merge key, an x-* key, an alias seen twice, a complex key
    ("a: &x {k: 1}\nb:\n  <<: *x\n  c: 1\n  c: 2\n", "f.yaml:5: b.c: duplicate key (first at line 4)"),
    ("x-a: 1\nb: 1\nb: 2\n", "f.yaml:3: b: duplicate key (first at line 2)"),
    ("c: {d: 1, d: 2}\na: &x {k: 1}\nb: *x\n", "f.yaml:1: c.d: duplicate key (first at line 1)"),
    ("? [a]\n: {c: 1, c: 2}\n", "f.yaml:2: <complex key>.c: duplicate key (first at line 2)"),
])
def test_parse_errors(text, message):
    assert error(text) == message


def test_two_merge_keys_are_not_duplicates():
    text = "a: &x {k: 1}\nb: &y {m: 2}\nc:\n  <<: *x\n  <<: *y\n"
    assert yamlfile.parse(text, "f.yaml")["c"] == {"k": 1, "m": 2}
