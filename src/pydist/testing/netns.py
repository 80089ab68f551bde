"""Several "hosts" on one Linux machine: network namespaces on a bridge, with shaped links.

``Network(hosts=N, rate=..., delay=..., loss=...)`` makes N network namespaces, each a host
with ``lo`` up and one interface ``eth0`` holding its own IPv4 address in a /24 of 10.77.0.0/16
that no other live Network and no interface of the machine uses. Each host's ``eth0`` is a veth
whose other end, ``h<i>``, is a port of a bridge in a namespace of its own (the "switch"), so
the machine's own namespace gains no interface, address or route; there is no default route
and no NAT: traffic stays between the hosts (and on each host's loopback)::

    from pydist.testing.netns import Network, require_netns
    require_netns(shaping=True)                       # pytest.skip(reason) if it cannot work
    with Network(hosts=2, rate="200mbit", delay="5ms") as net:
        server = net.popen(1, [sys.executable, "server.py", net.hosts[1].addr])
        result = net.run(0, [sys.executable, "client.py", net.hosts[1].addr], timeout=30)
        net.shape(0, rate="1gbit")                    # replaces host 0's shaping

Shaping (``Network.shape``): ``rate`` caps a host's link each way: a tbf qdisc on the egress of
both veth ends. ``delay`` and ``loss`` apply to what the host sends, so a round trip between
hosts i and j takes ``delay_i + delay_j`` longer and a packet from i is lost with probability
``loss_i``. Kernels without sch_netem exist (this project's machines have none), so delay and
loss are done in user space: once a host needs them, tc (clsact + u32 + mirred) steers what
arrives on ``h<i>`` to a TAP device ``d<i>a`` read by a relay process in the switch namespace,
which holds each frame for the delay (dropping it with probability ``loss``) and writes it into
a TAP ``d<i>b`` that is the host's bridge port instead of ``h<i>``; what the bridge sends out of
``d<i>b`` is redirected to ``h<i>``. Rate limiting happens before the delay, in the kernel.

Processes started with ``popen``/``run`` run in a new session inside the host's namespace
(``ip netns exec``). Leaving the ``with`` block (also on an exception, a KeyboardInterrupt,
garbage collection or interpreter exit) stops them by pid: SIGTERM to each process group and
to every process found inside the namespaces, SIGKILL after ``grace`` seconds; then it reaps
them and deletes the veths, the bridge and the namespaces. A new Network first deletes the
namespaces whose owning pid is gone (a crashed run), killing what still runs in them.

The link settings and their notation are in :mod:`._netns_shaping`, the ip/tc commands,
probing and process/namespace cleanup in :mod:`._netns_system`; the names tests use from
them (``Shaping``, ``parse_*``, ``netns_available``, ``require_netns``, ``pids_in``,
``cleanup_stale``) are importable from here.
"""
from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import sys
import threading
import weakref
from dataclasses import dataclass, field
from typing import Sequence

from ._netns_shaping import Shaping, parse_delay, parse_loss, parse_rate
from ._netns_system import (MATCH_ALL, NAME, NETNS_DIR, cleanup_stale, namespace_stem, netns_available, netns_inode,
                            pids_in, require_netns, run_tool, signal_pid, stop, tool_path)

__all__ = ["Host", "Network", "Shaping", "cleanup_stale", "netns_available", "parse_delay", "parse_loss",
           "parse_rate", "pids_in", "require_netns", "stop"]

_LOCK = threading.Lock()
_OCTETS_IN_USE: set[int] = set()  # third octets of this process's open Networks
#: Frames the relay's input TAP queues (the kernel's default, 1000, overflows when the relay lags).
_RELAY_QUEUE = 100_000
#: The delay/loss relay, run as a script (python -I) in the switch namespace.
RELAY_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_netns_relay.py")


def _octets_taken() -> set[int]:
    """Third octets of 10.77.x.0/24 that are in use: by live Networks of any process (their
    switch namespace's name says which) or by an address of this machine's interfaces."""
    taken = set(_OCTETS_IN_USE)
    for name in os.listdir(NETNS_DIR) if os.path.isdir(NETNS_DIR) else []:
        match = NAME.match(name)
        if match and match.group(3) is not None:
            taken.add(int(match.group(3)))
    for line in run_tool(["ip", "-4", "-o", "addr", "show"]).stdout.splitlines():
        fields = line.split()
        if "inet" in fields:
            net = ipaddress.IPv4Interface(fields[fields.index("inet") + 1]).network
            taken.update(octet for octet in range(256) if net.overlaps(ipaddress.IPv4Network(f"10.77.{octet}.0/24")))
    return taken


# --- the network ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Host:
    """One namespace: ``name`` (for ``ip netns exec``), ``addr`` (IPv4 of its ``eth0``)."""
    index: int
    name: str
    addr: str
    iface: str = "eth0"


@dataclass
class _Resources:
    """What a Network must release; kept apart from it so that a finalizer can hold it."""
    namespaces: list[str] = field(default_factory=list)  # the switch first
    procs: list[subprocess.Popen] = field(default_factory=list)
    relay: subprocess.Popen | None = None
    octet: int | None = None
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
            links = [f"link del h{i}" for i in range(len(res.namespaces) - 1)] + ["link del br0"]
            run_tool(["ip", "-force", "-n", res.namespaces[0]], links, check=False)
        for name in reversed(res.namespaces):
            run_tool(["ip", "netns", "del", name], check=False)
        res.namespaces.clear()
        with _LOCK:
            _OCTETS_IN_USE.discard(res.octet)
    finally:
        if on_main:
            signal.signal(signal.SIGINT, previous)
    if interrupted:
        raise KeyboardInterrupt


class Network:
    """``hosts`` network namespaces on one bridge, each link shaped by ``rate`` (bit/s, or tc
    notation: "1gbit"), ``delay`` ("20ms" or seconds) and ``loss`` (0.01 or "1%"): see
    ``shape``. ``grace``: seconds between SIGTERM and SIGKILL on close. Use it as a context
    manager (or call ``start`` and ``close``); raises RuntimeError naming the failing ip/tc
    command if the namespaces cannot be made (call ``require_netns()`` first in tests)."""

    def __init__(self, hosts: int = 2, rate: str | float | None = None, delay: str | float | None = None,
                 loss: str | float | None = None, grace: float = 2.0):
        if not 1 <= hosts <= 250:
            raise ValueError(f"hosts: expected 1 to 250, got {hosts}")
        self.size = hosts
        self._initial = Shaping.of(rate, delay, loss)
        self.shaping: list[Shaping] = [Shaping()] * hosts
        self.hosts: list[Host] = []
        self.subnet: ipaddress.IPv4Network | None = None
        self._res = _Resources(grace=grace)
        self._relayed: set[int] = set()
        self._finalizer: weakref.finalize | None = None

    def __enter__(self) -> "Network":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> "Network":
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
        with _LOCK:
            free = sorted(set(range(1, 255)) - _octets_taken(), key=lambda octet: (octet - os.getpid()) % 254)
            if not free:
                raise RuntimeError("no free /24 left in 10.77.0.0/16")
            self._res.octet = free[0]
            _OCTETS_IN_USE.add(free[0])
            self.subnet = ipaddress.IPv4Network(f"10.77.{free[0]}.0/24")
            stem = namespace_stem()
            self.hosts = [Host(i, f"{stem}-h{i}", str(self.subnet[i + 1])) for i in range(self.size)]
            self._res.namespaces.append(f"{stem}-sw{free[0]}")
            run_tool(["ip", "netns", "add", self._switch])
        for host in self.hosts:
            self._res.namespaces.append(host.name)
            run_tool(["ip", "netns", "add", host.name])
        lines = ["link set lo up", "link add br0 type bridge", "link set br0 up"]
        for i, host in enumerate(self.hosts):
            lines += [f"link add h{i} type veth peer name eth0 netns {host.name}", f"link set h{i} master br0",
                      f"link set h{i} up"]
        run_tool(["ip", "-n", self._switch], lines)
        for host in self.hosts:
            run_tool(["ip", "-n", host.name],
                     ["link set lo up", f"addr add {host.addr}/24 dev eth0", "link set eth0 up"])

    @property
    def _switch(self) -> str:
        return self._res.namespaces[0]

    def shape(self, i: int, rate: str | float | None = None, delay: str | float | None = None,
              loss: str | float | None = None) -> Shaping:
        """Replace host ``i``'s shaping (None: none of that kind). ``rate`` caps its link each
        way (tbf on the egress of both veth ends); ``delay`` and ``loss`` apply to the packets
        host ``i`` sends (through the relay, which stays in the path once used, at delay 0 if
        so set). Returns the Shaping now in force."""
        self._check_started()
        new, old = Shaping.of(rate, delay, loss), self.shaping[i]
        for namespace, dev in ((self.hosts[i].name, "eth0"), (self._switch, f"h{i}")):
            if new.rate:
                run_tool(["tc", "-n", namespace], [line.replace("qdisc add", "qdisc replace") for line in new.tbf(dev)])
            elif old.rate:
                run_tool(["tc", "-n", namespace, "qdisc", "del", "dev", dev, "root"])
        if new.delay or new.loss or i in self._relayed:
            self._relay_link(i)
            self._relay_call(f"set {i} {new.delay!r} {new.loss!r}")
        self.shaping[i] = new
        return new

    def link_down(self, i: int) -> None:
        """Cut host ``i`` off: its bridge port goes down, so the others' packets to it and its
        to them vanish (no FIN, no RST), as when a host loses power or its cable."""
        self._check_started()
        ports = [f"h{i}"] + ([f"d{i}b"] if i in self._relayed else [])
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

    def _relay_link(self, i: int) -> None:
        """Put the relay between host ``i`` and the bridge (see the module's docstring)."""
        if i in self._relayed:
            return
        if self._res.relay is None:
            self._res.relay = self._spawn(self._switch, [sys.executable, "-I", RELAY_SCRIPT],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._relay_call(f"add {i}")
        switch = self._switch
        run_tool(["tc", "-n", switch], [f"qdisc add dev d{i}b clsact", f"filter add dev d{i}b egress {MATCH_ALL} h{i}"])
        # d<i>a queues what the relay has not read yet: deep enough that a relay slowed by a
        # loaded machine delays frames instead of the kernel dropping them (only LOSS drops)
        run_tool(["ip", "-n", switch], [f"link set d{i}a txqueuelen {_RELAY_QUEUE}", f"link set d{i}a up",
                                    f"link set d{i}b master br0", f"link set d{i}b up", f"link set h{i} nomaster"])
        run_tool(["tc", "-n", switch], [f"qdisc add dev h{i} clsact", f"filter add dev h{i} ingress {MATCH_ALL} d{i}a"])
        self._relayed.add(i)

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
        return f"Network({', '.join(f'{host.name}={host.addr}' for host in self.hosts)})"
