"""Several "hosts" on one Linux machine: network namespaces on a bridge, with shaped links.

``Network(hosts=N, rate=..., delay=..., loss=...)`` makes N network namespaces, each a host
with ``lo`` up and one interface ``eth0`` holding its own IPv4 address in a /24 of 10.77.0.0/16
that no other live Network and no interface of the machine uses. Each host's ``eth0`` is a veth
whose other end, ``h<i>``, is a port of a bridge in a namespace of its own (the "switch"), so
the machine's own namespace gains no interface, address or route; there is no default route
and no NAT: traffic stays between the hosts (and on each host's loopback).

``interfaces=N`` gives each host N interfaces ``eth0`` .. ``eth<N-1>``: interface k of every
host is on a bridge ``br<k>`` of its own, in a /24 of its own (``Host.addrs[k]``, ``Host.ifaces``,
``Network.subnets``), so the hosts are joined by N separate networks. ``ipv6=True`` gives every
interface an IPv6 address too (``Host.addrs6``, ``Host.addr6``: ``fd77:<third octet>::<i+1>/64``,
a ULA, added ``nodad`` so usable at once; IPv6 is enabled in the host namespaces and ``lo`` has
``::1``); ``ipv6="only"`` gives the IPv6 addresses and no IPv4 one (``lo`` keeps 127.0.0.1),
and then ``Host.addr``/``Host.addrs`` are the IPv6 addresses::

    from pydist.testing.netns import Network, require_netns
    require_netns(shaping=True)                       # pytest.skip(reason) if it cannot work
    with Network(hosts=2, rate="200mbit", delay="5ms") as net:
        server = net.popen(1, [sys.executable, "server.py", net.hosts[1].addr])
        result = net.run(0, [sys.executable, "client.py", net.hosts[1].addr], timeout=30)
        net.shape(0, rate="1gbit")                    # replaces host 0's shaping
    with Network(hosts=2, interfaces=2, ipv6=True) as net:
        net.shape(0, rate="100mbit", iface=1)         # only host 0's eth1
        net.link_down(1, iface=0)                     # host 1 is still reachable over eth1

Shaping (``Network.shape``; ``iface=k`` for one interface, else all of the host's): ``rate``
caps a host's link each way: a tbf qdisc on the egress of both veth ends. ``delay`` and
``loss`` apply to what the host sends, so a round trip between hosts i and j takes
``delay_i + delay_j`` longer and a packet from i is lost with probability ``loss_i``. Kernels
without sch_netem exist (this project's machines have none), so delay and loss are done in user
space: once a host needs them, tc (clsact + u32 + mirred) steers what arrives on ``h<i>`` to a
TAP device ``d<i>a`` read by a relay process in the switch namespace, which holds each frame
for the delay (dropping it with probability ``loss``) and writes it into a TAP ``d<i>b`` that
is the host's bridge port instead of ``h<i>``; what the bridge sends out of ``d<i>b`` is
redirected to ``h<i>``. Rate limiting happens before the delay, in the kernel. Interface k > 0
of host i works the same with switch port ``h<i>e<k>`` and TAPs ``d<i + 256 k>a``/``b``:
delay and loss are per interface, like rate.

Processes started with ``popen``/``run`` run in a new session inside the host's namespace
(``ip netns exec``). Leaving the ``with`` block (also on an exception, a KeyboardInterrupt,
garbage collection or interpreter exit) stops them by pid: SIGTERM to each process group and
to every process found inside the namespaces, SIGKILL after ``grace`` seconds; then it reaps
them and deletes the veths, the bridges and the namespaces. A new Network first deletes the
namespaces whose owning pid is gone (a crashed run), killing what still runs in them.

The link settings and their notation are in :mod:`._netns_shaping`, the ip/tc commands,
probing and process/namespace cleanup in :mod:`._netns_system`; the names tests use from
them (``Shaping``, ``parse_*``, ``netns_available``, ``require_netns``, ``pids_in``,
``cleanup_stale``) are importable from here. ``require_netns(ipv6=True)`` also skips when the
kernel has no IPv6.
"""
from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import sys
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from ._netns_shaping import Shaping, parse_delay, parse_loss, parse_rate
from ._netns_system import (
    MATCH_ALL,
    NETNS_DIR,
    cleanup_stale,
    enable_ipv6,
    namespace_stem,
    netns_available,
    netns_inode,
    pids_in,
    require_netns,
    run_tool,
    signal_pid,
    stop,
    switch_octets,
    tool_path,
)

__all__ = ["Host", "Network", "Shaping", "cleanup_stale", "netns_available", "parse_delay", "parse_loss",
           "parse_rate", "pids_in", "require_netns", "stop"]

_LOCK = threading.Lock()
_OCTETS_IN_USE: set[int] = set()  # third octets of this process's open Networks
#: Most interfaces a host may have (port names h<i>e<k> must fit in 15 characters).
MAX_INTERFACES = 16
#: Frames the relay's input TAP queues (the kernel's default, 1000, overflows when the relay lags).
_RELAY_QUEUE = 100_000
#: The delay/loss relay, run as a script (python -I) in the switch namespace.
RELAY_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_netns_relay.py")


def _subnet4(octet: int) -> ipaddress.IPv4Network:
    return ipaddress.IPv4Network(f"10.77.{octet}.0/24")


def _subnet6(octet: int) -> ipaddress.IPv6Network:
    """The IPv6 twin of 10.77.<octet>.0/24: fd77:<octet>::/64 (the octet's digits as a group)."""
    return ipaddress.IPv6Network(f"fd77:{octet}::/64")


def _octets_taken(ipv6: bool = False) -> set[int]:
    """Third octets of 10.77.x.0/24 that are in use: by live Networks of any process (their
    switch namespace's name says which) or by an address of this machine's interfaces in
    10.77.x.0/24 (or, with ``ipv6``, in fd77:x::/64)."""
    taken = set(_OCTETS_IN_USE)
    for name in os.listdir(NETNS_DIR) if os.path.isdir(NETNS_DIR) else []:
        taken.update(switch_octets(name))
    for line in run_tool(["ip", "-o", "addr", "show"]).stdout.splitlines():
        fields = line.split()
        for family, subnet in (("inet", _subnet4),) + ((("inet6", _subnet6),) if ipv6 else ()):
            if family in fields:
                net = ipaddress.ip_interface(fields[fields.index(family) + 1]).network
                taken.update(octet for octet in range(256) if net.overlaps(subnet(octet)))
    return taken


def _port(i: int, k: int) -> str:
    """The switch's end of host ``i``'s interface ``k`` (``h<i>`` for eth0, as ever)."""
    return f"h{i}" if k == 0 else f"h{i}e{k}"


def _relay_id(i: int, k: int) -> int:
    """The relay's number for host ``i``'s interface ``k``: its TAPs are d<id>a and d<id>b."""
    return i + 256 * k


# --- the network ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Host:
    """One namespace: ``name`` (for ``ip netns exec``), ``addr`` (IPv4 of its ``eth0``; with
    ``ipv6="only"`` its IPv6 address). ``ifaces``: its interfaces (``eth0`` ..), ``addrs``: the
    address of each (``addrs[0] == addr``; IPv6 with ``ipv6="only"``), ``addrs6``: the IPv6
    address of each (empty without ``ipv6``), ``addr6``: the first (None without ``ipv6``)."""
    index: int
    name: str
    addr: str
    iface: str = "eth0"
    addrs: tuple[str, ...] = ()
    ifaces: tuple[str, ...] = ()
    addrs6: tuple[str, ...] = ()
    addr6: str | None = None

    def __post_init__(self) -> None:  # a Host made as before (index, name, addr) has one interface
        if not self.addrs:
            object.__setattr__(self, "addrs", (self.addr,))
        if not self.ifaces:
            object.__setattr__(self, "ifaces", (self.iface,))
        if self.addr6 is None and self.addrs6:
            object.__setattr__(self, "addr6", self.addrs6[0])


@dataclass
class _Resources:
    """What a Network must release; kept apart from it so that a finalizer can hold it."""
    namespaces: list[str] = field(default_factory=list)  # the switch first
    procs: list[subprocess.Popen] = field(default_factory=list)
    relay: subprocess.Popen | None = None
    octets: list[int] = field(default_factory=list)  # the third octet of each interface's subnet
    interfaces: int = 1
    grace: float = 2.0
    leftovers: list[int] = field(default_factory=list)


def _teardown(res: _Resources) -> None:
    """Stop every process, reap, delete veths, bridge and namespaces. A SIGINT arriving
    meanwhile (on the main thread) is held until the end, then raised."""
    interrupted = []
    on_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, lambda *_: interrupted.append(1)) if on_main else None
    try:
        inodes = {ino for ino in map(netns_inode, res.namespaces) if ino is not None}
        res.leftovers = stop(res.procs + ([res.relay] if res.relay else []), inodes, res.grace)
        if res.relay is not None:
            assert res.relay.stdin is not None and res.relay.stdout is not None  # started with pipes
            res.relay.stdin.close()
            res.relay.stdout.close()
        if res.namespaces:  # the veths and the bridge go now, not when the kernel gets round to it
            links = [f"link del {_port(i, k)}" for i in range(len(res.namespaces) - 1) for k in range(res.interfaces)]
            links += [f"link del br{k}" for k in range(res.interfaces)]
            run_tool(["ip", "-force", "-n", res.namespaces[0]], links, check=False)
        for name in reversed(res.namespaces):
            run_tool(["ip", "netns", "del", name], check=False)
        res.namespaces.clear()
        with _LOCK:
            _OCTETS_IN_USE.difference_update(res.octets)
        res.octets.clear()
    finally:
        if on_main:
            signal.signal(signal.SIGINT, previous)
    if interrupted:
        raise KeyboardInterrupt


class Network:
    """``hosts`` network namespaces on one bridge (``interfaces`` > 1: that many bridges, each
    host on each), each link shaped by ``rate`` (bit/s, or tc notation: "1gbit"), ``delay``
    ("20ms" or seconds) and ``loss`` (0.01 or "1%"): see ``shape``. ``ipv6``: False (IPv4
    only), True (IPv4 and IPv6) or "only" (IPv6 only). ``grace``: seconds between SIGTERM and
    SIGKILL on close. Use it as a context manager (or call ``start`` and ``close``); raises
    RuntimeError naming the failing ip/tc command if the namespaces cannot be made (call
    ``require_netns()`` first in tests).

    Once started: ``hosts`` (:class:`Host` each), ``subnet`` (the network of ``Host.addr``),
    ``subnets`` (that of each ``Host.addrs[k]``), ``subnets6`` (that of each ``Host.addrs6[k]``),
    ``shaping[i]`` (host i's eth0 shaping) and ``iface_shaping[i][k]`` (its eth<k>'s)."""

    def __init__(self, hosts: int = 2, rate: str | float | None = None, delay: str | float | None = None,
                 loss: str | float | None = None, grace: float = 2.0, *, interfaces: int = 1,
                 ipv6: bool | Literal["only"] = False):
        if not 1 <= hosts <= 250:
            raise ValueError(f"hosts: expected 1 to 250, got {hosts}")
        if not 1 <= interfaces <= MAX_INTERFACES:
            raise ValueError(f"interfaces: expected 1 to {MAX_INTERFACES}, got {interfaces}")
        if ipv6 not in (False, True, "only"):
            raise ValueError(f"ipv6: expected False, True or 'only', got {ipv6!r}")
        self.size = hosts
        self.interfaces = interfaces
        self.ipv6 = ipv6
        self._initial = Shaping.of(rate, delay, loss)
        self.shaping: list[Shaping] = [Shaping()] * hosts
        self.iface_shaping: list[list[Shaping]] = [[Shaping()] * interfaces for _ in range(hosts)]
        self.hosts: list[Host] = []
        self.subnet: ipaddress.IPv4Network | ipaddress.IPv6Network | None = None
        self.subnets: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
        self.subnets6: tuple[ipaddress.IPv6Network, ...] = ()
        self._res = _Resources(grace=grace, interfaces=interfaces)
        self._relayed: set[int] = set()  # relay ids (_relay_id) of the interfaces behind the relay
        self._finalizer: weakref.finalize | None = None

    def __enter__(self) -> Network:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> Network:
        """Make the namespaces, bridge, links and addresses, and apply the initial shaping."""
        if self._finalizer is not None:
            raise RuntimeError("Network already started")
        self._finalizer = weakref.finalize(self, _teardown, self._res)
        try:
            cleanup_stale()
            self._create()
            for i in range(self.size):
                self.shape(i, self._initial.rate, self._initial.delay, self._initial.loss)
        except BaseException:
            self.close()
            raise
        return self

    def _create(self) -> None:
        count = self.interfaces
        with _LOCK:
            taken = _octets_taken(bool(self.ipv6))
            free = sorted(set(range(1, 255)) - taken, key=lambda octet: (octet - os.getpid()) % 254)
            if len(free) < count:
                raise RuntimeError(f"no {count} free /24s left in 10.77.0.0/16 (free: {len(free)})")
            octets = free[:count]
            self._res.octets = octets
            _OCTETS_IN_USE.update(octets)
            subnets4 = tuple(map(_subnet4, octets))
            self.subnets6 = tuple(map(_subnet6, octets)) if self.ipv6 else ()
            self.subnets = self.subnets6 if self.ipv6 == "only" else subnets4
            self.subnet = self.subnets[0]
            stem = namespace_stem()
            ifaces = tuple(f"eth{k}" for k in range(count))
            self.hosts = [Host(i, f"{stem}-h{i}", str(self.subnets[0][i + 1]),
                               addrs=tuple(str(net[i + 1]) for net in self.subnets), ifaces=ifaces,
                               addrs6=tuple(str(net[i + 1]) for net in self.subnets6))
                          for i in range(self.size)]
            self._res.namespaces.append(f"{stem}-sw{'_'.join(map(str, octets))}")
            run_tool(["ip", "netns", "add", self._switch])
        for host in self.hosts:
            self._res.namespaces.append(host.name)
            run_tool(["ip", "netns", "add", host.name])
        if self.ipv6:  # before the interfaces are made: they take the namespace's default
            enable_ipv6([host.name for host in self.hosts])
        # without multicast snooping a bridge floods neighbour solicitations whatever MLD said
        bridge = "type bridge" + (" mcast_snooping 0" if self.ipv6 else "")
        lines = ["link set lo up"]
        for k in range(count):
            lines += [f"link add br{k} {bridge}", f"link set br{k} up"]
            for i, host in enumerate(self.hosts):
                port = _port(i, k)
                lines += [f"link add {port} type veth peer name eth{k} netns {host.name}",
                          f"link set {port} master br{k}", f"link set {port} up"]
        run_tool(["ip", "-n", self._switch], lines)
        for i, host in enumerate(self.hosts):
            lines = ["link set lo up"] + (["addr replace ::1/128 dev lo"] if self.ipv6 else [])
            for k, iface in enumerate(host.ifaces):
                if self.ipv6 != "only":
                    lines.append(f"addr add {subnets4[k][i + 1]}/24 dev {iface}")
                if self.ipv6:
                    lines.append(f"addr add {host.addrs6[k]}/64 dev {iface} nodad")
                lines.append(f"link set {iface} up")
            run_tool(["ip", "-n", host.name], lines)

    @property
    def _switch(self) -> str:
        return self._res.namespaces[0]

    def _iface_range(self, iface: int | None) -> range:
        """The interfaces ``iface`` means: that one, or (None) all."""
        if iface is None:
            return range(self.interfaces)
        if not 0 <= iface < self.interfaces:
            raise ValueError(f"iface: expected 0 to {self.interfaces - 1} (or None: all), got {iface!r}")
        return range(iface, iface + 1)

    def shape(self, i: int, rate: str | float | None = None, delay: str | float | None = None,
              loss: str | float | None = None, iface: int | None = None) -> Shaping:
        """Replace the shaping of host ``i``'s interface ``iface`` (None: of each of its
        interfaces; a setting None: none of that kind). ``rate`` caps the link each way (tbf on
        the egress of both veth ends); ``delay`` and ``loss`` apply to the packets host ``i``
        sends over it (through the relay, which stays in the path once used, at delay 0 if so
        set). Returns the Shaping now in force."""
        self._check_started()
        new, host = Shaping.of(rate, delay, loss), self.hosts[i]
        for k in self._iface_range(iface):
            old = self.iface_shaping[i][k]
            for namespace, dev in ((host.name, host.ifaces[k]), (self._switch, _port(i, k))):
                if new.rate:
                    run_tool(["tc", "-n", namespace],
                             [line.replace("qdisc add", "qdisc replace") for line in new.tbf(dev)])
                elif old.rate:
                    run_tool(["tc", "-n", namespace, "qdisc", "del", "dev", dev, "root"])
            if new.delay or new.loss or _relay_id(i, k) in self._relayed:
                self._relay_link(i, k)
                self._relay_call(f"set {_relay_id(i, k)} {new.delay!r} {new.loss!r}")
            self.iface_shaping[i][k] = new
        self.shaping[i] = self.iface_shaping[i][0]
        return new

    def link_down(self, i: int, iface: int | None = None) -> None:
        """Cut host ``i`` off (``iface``: only that interface of it, None: all): the bridge
        port goes down, so the others' packets to it and its to them vanish (no FIN, no RST),
        as when a host loses power or a cable."""
        self._check_started()
        ports = []
        for k in self._iface_range(iface):
            relay_id = _relay_id(i, k)
            ports += [_port(i, k)] + ([f"d{relay_id}b"] if relay_id in self._relayed else [])
        run_tool(["ip", "-n", self._switch], [f"link set {port} down" for port in ports])

    def _relay_call(self, line: str) -> None:
        relay = self._res.relay
        # _relay_link started it, with pipes
        assert relay is not None and relay.stdin is not None and relay.stdout is not None
        relay.stdin.write(line + "\n")
        relay.stdin.flush()
        answer = relay.stdout.readline().strip()
        if answer != "ok":
            raise RuntimeError(f"delay relay: {line!r}: {answer or f'exited with {relay.poll()}'}")

    def _relay_link(self, i: int, k: int = 0) -> None:
        """Put the relay between host ``i``'s interface ``k`` and its bridge (see the module's
        docstring)."""
        n, port = _relay_id(i, k), _port(i, k)
        if n in self._relayed:
            return
        if self._res.relay is None:
            self._res.relay = self._spawn(self._switch, [sys.executable, "-I", RELAY_SCRIPT],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._relay_call(f"add {n}")
        switch = self._switch
        run_tool(["tc", "-n", switch],
                 [f"qdisc add dev d{n}b clsact", f"filter add dev d{n}b egress {MATCH_ALL} {port}"])
        # d<n>a queues what the relay has not read yet: deep enough that a relay slowed by a
        # loaded machine delays frames instead of the kernel dropping them (only LOSS drops)
        run_tool(["ip", "-n", switch], [f"link set d{n}a txqueuelen {_RELAY_QUEUE}", f"link set d{n}a up",
                                    f"link set d{n}b master br{k}", f"link set d{n}b up", f"link set {port} nomaster"])
        run_tool(["tc", "-n", switch],
                 [f"qdisc add dev {port} clsact", f"filter add dev {port} ingress {MATCH_ALL} d{n}a"])
        self._relayed.add(n)

    def _check_started(self) -> None:
        if self._finalizer is None or not self._finalizer.alive:
            raise RuntimeError("Network is not running (use it as a context manager)")

    @staticmethod
    def _spawn(namespace: str, argv: Sequence[str], **popen_kwargs) -> subprocess.Popen:
        return subprocess.Popen([tool_path("ip"), "netns", "exec", namespace, *argv], start_new_session=True,
                                **popen_kwargs)

    def popen(self, i: int, argv: Sequence[str], env: dict[str, str] | None = None,
              **popen_kwargs) -> subprocess.Popen:
        """Start ``argv`` inside host ``i``'s namespace, in a new session (its pid is its process
        group id); it is stopped when the Network closes. Other arguments go to Popen."""
        self._check_started()
        if not popen_kwargs.pop("start_new_session", True):
            raise ValueError("popen: the child must lead a session of its own (start_new_session=True)")
        proc = self._spawn(self.hosts[i].name, argv, env=env, **popen_kwargs)
        self._res.procs.append(proc)
        return proc

    def run(self, i: int, argv: Sequence[str], timeout: float = 60.0, *, check: bool = False,
            input: str | bytes | None = None, capture_output: bool = True, text: bool = True,
            env: dict[str, str] | None = None, **popen_kwargs) -> subprocess.CompletedProcess:
        """Like subprocess.run inside host ``i``, output captured as text by default. On
        ``timeout`` the process group is killed and subprocess.TimeoutExpired raised."""
        if capture_output:
            popen_kwargs.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if input is not None:
            popen_kwargs["stdin"] = subprocess.PIPE
        proc = self.popen(i, argv, env=env, text=text, **popen_kwargs)
        with proc:
            try:
                out, err = proc.communicate(input, timeout=timeout)
            except BaseException:
                signal_pid(proc.pid, signal.SIGKILL, group=True)
                raise
        result = subprocess.CompletedProcess(list(argv), proc.returncode, out, err)
        if check:
            result.check_returncode()
        return result

    def close(self) -> None:
        """Stop and reap every process, delete links and namespaces. Idempotent."""
        if self._finalizer is not None:
            self._finalizer()

    @property
    def leftovers(self) -> list[int]:
        """Pids that were still inside the namespaces after SIGKILL at close (normally none)."""
        return list(self._res.leftovers)

    def __repr__(self) -> str:
        def addresses(host: Host) -> str:
            return ",".join(host.addrs + (host.addrs6 if self.ipv6 is True else ()))
        return f"Network({', '.join(f'{host.name}={addresses(host)}' for host in self.hosts)})"
