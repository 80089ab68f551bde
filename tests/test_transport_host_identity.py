"""Host identity (locality: who shares memory) and the machine under it (who shares CPUs)."""
from __future__ import annotations

from pydist.core.settings import settings
from pydist.transport.identity import host_identity, machine_of


def test_network_namespaces_of_one_machine_are_hosts_of_one_machine():
    mine = host_identity(settings())
    assert len(mine.split("/")) == 3  # host name, boot id, network namespace
    name, boot, _ = mine.split("/")
    other_namespace = f"{name}/{boot}/4026532999"
    assert other_namespace != mine and machine_of(other_namespace) == machine_of(mine) == f"{name}/{boot}"
    assert machine_of(f"{name}/another-boot/{_}") != machine_of(mine)


def test_a_given_identity_is_its_own_machine(monkeypatch):
    monkeypatch.setenv("PYDIST_HOST_ID", "rack3-node7")
    assert host_identity(settings()) == "rack3-node7" and machine_of("rack3-node7") == "rack3-node7"

