"""The line-tracking YAML loader and its value checks (diagnostics/yamlfile.py), directly:
the edges that hosts.yaml and runbook tests do not reach (found by mutation testing, see
setup.cfg)."""

import pytest
import yaml

from diagnostics import yamlfile
from diagnostics.errors import InputError
from diagnostics.yamlfile import At


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
