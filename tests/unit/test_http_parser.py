"""gunicorn.conf.py's settings keep gunicorn's C parser (gunicorn_h1c) on, and the start says which
parser reads requests. What the C parser answers to hostile heads: tests/live/test_malformed_requests.py."""

import runpy
from importlib import metadata

import pytest
from gunicorn.config import Config
from liveserver import ROOT

conf = runpy.run_path(str(ROOT / "gunicorn.conf.py"))


def service_config(**changes):
    cfg = Config()
    for name, value in conf.items():
        if name in cfg.settings:
            cfg.set(name, value)
    for name, value in changes.items():
        cfg.set(name, value)
    return cfg


def test_the_service_settings_read_requests_with_the_c_parser():
    assert conf["http_parser_in_use"](service_config()) == (
        f"Parsing requests with gunicorn's C parser (gunicorn_h1c {metadata.version('gunicorn_h1c')})")


@pytest.mark.parametrize("changes", [{"permit_obsolete_folding": True}, {"strip_header_spaces": True},
                                     {"http_parser": "python"}])
def test_a_setting_that_turns_the_c_parser_off_is_said_at_start(changes):
    assert conf["http_parser_in_use"](service_config(**changes)).startswith(
        "Parsing requests with gunicorn's Python parser: ")
