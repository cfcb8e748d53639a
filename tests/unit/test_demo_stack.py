"""The demo's children: a taken port is replaced, and the environment cannot redirect them."""

from __future__ import annotations

import socket

import pytest

from materializer.demo.stack import HOST, child_env, choose_port, port_is_free


def test_a_taken_port_is_replaced_by_a_free_one():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind((HOST, 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert not port_is_free(port)
        other = choose_port(port)
        assert other != port and port_is_free(other)
    assert choose_port(other) == other


def test_children_ignore_config_overrides_from_the_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("MATERIALIZER_REDIS_URL", "redis://elsewhere:6379/0")
    monkeypatch.setenv("MATERIALIZER_QUERY_PORT", "1")
    monkeypatch.setenv("SOMETHING_ELSE", "kept")
    env = child_env()
    assert "MATERIALIZER_REDIS_URL" not in env and "MATERIALIZER_QUERY_PORT" not in env
    assert env["SOMETHING_ELSE"] == "kept"
