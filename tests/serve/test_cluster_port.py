"""The Serve proxy's port: 0 takes a free one that neither the kernel nor a starting Ray hands out, and a port
that is taken is refused by name (tests/serve/test_cluster_cli.py starts Ray with both)."""

from __future__ import annotations

import errno
import socket

import pytest

pytest.importorskip("ray.serve")

from duplexcadence.interpreter.serve import messages
from duplexcadence.interpreter.serve.cluster import launch
from duplexcadence.interpreter.serve.cluster.launch import ClusterConfig, ClusterStartError


def test_a_free_port_lies_below_the_kernels_ephemeral_range_and_is_free():
    if launch.ephemeral_port_floor() <= launch.FREE_PORT_LOW + 1000:
        pytest.skip("this kernel's ephemeral range starts below 21000: no port lies between it and Ray's")
    port = launch.free_proxy_port("127.0.0.1")
    assert launch.FREE_PORT_LOW <= port < launch.ephemeral_port_floor()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", port))


def test_a_taken_port_is_passed_over(monkeypatch):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        with socket.socket() as spare:
            spare.bind(("127.0.0.1", 0))
            free = spare.getsockname()[1]
        drawn = iter([taken, taken, free])
        monkeypatch.setattr(launch.random, "choice", lambda ports: next(drawn))
        assert launch.free_proxy_port("127.0.0.1") == free


def test_no_free_port_in_the_range_is_a_start_error(monkeypatch):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        monkeypatch.setattr(launch.random, "choice", lambda ports: taken)
        with pytest.raises(ClusterStartError) as refused:
            launch.free_proxy_port("127.0.0.1")
    last = launch.free_port_range().stop - 1
    assert str(refused.value) == f"no free port on 127.0.0.1 from 20000 to {last} for the Serve proxy"


def test_a_host_that_is_not_of_this_machine_is_named_not_retried():
    host = "203.0.113.7"  # TEST-NET-3: never an address of this machine
    error = launch.bind_error(host, 20000)
    if error is None or error.errno != errno.EADDRNOTAVAIL:
        pytest.skip(f"{host} binds here")
    with pytest.raises(ClusterStartError) as refused:
        launch.free_proxy_port(host)
    assert str(refused.value).startswith(f"the Serve proxy cannot listen on {host}:")
    assert str(refused.value).endswith(f": {error.strerror} ({host} is not an address of this machine)")


@pytest.mark.parametrize("port", [-1, 65536])
def test_a_port_out_of_range_is_a_config_problem(port):
    assert ClusterConfig(port=port).problems() == [f"the proxy's port must be 0 (a free one) to 65535, not {port}"]


def test_the_port_taken_wording_names_the_address_and_what_would_work():
    assert messages.proxy_port_taken("127.0.0.1", 8000) == (
        "the Serve proxy cannot listen on 127.0.0.1:8000: the port is in use (another port, or 0 for a free one)"
    )
    assert messages.proxy_port_taken("127.0.0.1", 23456, tries=3) == (
        "the Serve proxy could not bind a free port on 127.0.0.1: each of 3 was taken first (last 23456)"
    )
