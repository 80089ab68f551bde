"""Choosing the interface: PYDIST_SOCKET_IFNAME (NCCL's syntax), GLOO_SOCKET_IFNAME as a
fallback, a clear error when nothing matches, and the chosen address in errors and traces."""
from __future__ import annotations

import json
import socket

import pytest

import pydist
from pydist.core.errors import DistNetworkError
from pydist.core.settings import settings
from pydist.net.interfaces import Interface, interface_of, interfaces, matching, named_addresses
from pydist.store import HashStore
from pydist.transport.identity import advertise_address

HOST = [Interface("lo", ("127.0.0.1", "::1")), Interface("eth0", ("10.0.0.2", "fd00::2")),
        Interface("eth1", ("10.1.0.2",)), Interface("docker0", ("172.17.0.1",)), Interface("ib0", ("fd01::2",))]


def names(spec: str) -> list[str]:
    return [i.name for i in matching(spec, HOST)]


@pytest.mark.parametrize("spec, expected", [
    ("eth", ["eth0", "eth1"]), ("eth1,eth0", ["eth1", "eth0"]), ("=eth", []), ("=eth1", ["eth1"]),
    ("^docker,lo", ["eth0", "eth1", "ib0"]), ("^=eth", ["eth0", "eth1", "docker0", "ib0"]),
    ("^=eth0", ["eth1", "docker0", "ib0"]), ("^eth,docker,ib", ["lo"]), ("ib, eth0", ["ib0", "eth0"]),
])
def test_nccl_syntax(spec, expected):
    assert names(spec) == expected


@pytest.fixture
def no_ifname(monkeypatch):
    for variable in ("PYDIST_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "PYDIST_ADVERTISE_ADDR"):
        monkeypatch.delenv(variable, raising=False)
    return monkeypatch


def test_an_interface_named_gives_its_address_in_the_stores_family(no_ifname):
    lo = next(i for i in interfaces() if i.name == "lo")
    no_ifname.setenv("PYDIST_SOCKET_IFNAME", "=lo")
    assert named_addresses(socket.AF_INET) == [("lo", lo.addresses[0])]
    if "::1" in lo.addresses:
        assert named_addresses(socket.AF_INET6) == [("lo", "::1")]
    assert advertise_address(HashStore(), settings()) == "127.0.0.1"


def test_gloo_socket_ifname_counts_when_pydists_is_unset_and_names_are_exact(no_ifname):
    no_ifname.setenv("GLOO_SOCKET_IFNAME", "lo")
    assert named_addresses(socket.AF_INET) == [("lo", "127.0.0.1")]
    no_ifname.setenv("GLOO_SOCKET_IFNAME", "l")  # gloo names whole interfaces: no prefix match
    with pytest.raises(DistNetworkError, match=r"^GLOO_SOCKET_IFNAME=l matches no interface"):
        named_addresses(socket.AF_INET)
    no_ifname.setenv("PYDIST_SOCKET_IFNAME", "l")  # pydist's own wins, with NCCL's prefixes
    assert named_addresses(socket.AF_INET)[0] == ("lo", "127.0.0.1")


@pytest.fixture
def store():
    made = pydist.TCPStore("127.0.0.1", 0, 1, True)
    yield made
    made.close()


def test_a_name_matching_nothing_is_a_clear_error_listing_the_interfaces(no_ifname, store):
    no_ifname.setenv("PYDIST_SOCKET_IFNAME", "wlan9")
    with pytest.raises(DistNetworkError) as caught:
        pydist.init_process_group("pydist", store=store, rank=0, world_size=1)
    message = str(caught.value)
    assert message.startswith("PYDIST_SOCKET_IFNAME=wlan9 matches no interface with an address on"), message
    assert "lo (127.0.0.1" in message, message
    assert not pydist.is_initialized()


def test_the_address_and_interface_show_in_the_trace_file(no_ifname, store, tmp_path):
    no_ifname.setenv("PYDIST_SOCKET_IFNAME", "lo")
    pydist.init_process_group("pydist", store=store, rank=0, world_size=1)
    try:
        path = pydist.debug.dump_traces(str(tmp_path))[0]
    finally:
        pydist.destroy_process_group()
    assert json.loads(open(path).read())["endpoint"] == "127.0.0.1, lo"
    from pydist.debug.analyze import main_text
    assert "(127.0.0.1, lo) pid" in main_text([str(tmp_path)])


def test_interface_of_an_address():
    assert interface_of("127.0.0.1") == "lo"
    assert interface_of("192.0.2.254") == ""
