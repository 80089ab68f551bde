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
them and deletes the veths, the bridge and the namespaces. Namespace names are
``pydistnet-<pid>-<counter>-h<i>`` (switch: ``-sw<third octet>``); a new Network first deletes
those whose owning pid is gone (a crashed run), killing what still runs in them.
"""
from __future__ import annotations

import ipaddress
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Sequence

PREFIX = "pydistnet-"
NETNS_DIR = "/var/run/netns"
_NAME = re.compile(rf"^{PREFIX}(\d+)-(\d+)-(?:sw(\d+)|h(\d+))$")
_COUNTER = itertools.count()
_LOCK = threading.Lock()
_OCTETS_IN_USE: set[int] = set()  # third octets of this process's open Networks
_SBIN = "/usr/local/sbin:/usr/sbin:/sbin"
_MATCH_ALL = "protocol all prio 1 u32 match u32 0 0 action mirred egress redirect dev"
#: The delay/loss relay, run as a script (python -I) in the switch namespace.
RELAY_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_netns_relay.py")


# --- commands -------------------------------------------------------------------------------

def _which(tool: str) -> str | None:
    return shutil.which(tool) or shutil.which(tool, path=_SBIN)


def _tool(tool: str) -> str:
    path = _which(tool)
    if path is None:
        raise FileNotFoundError(f"'{tool}' not found on PATH or in {_SBIN} (Debian: apt-get install iproute2)")
    return path


def _cmd(argv: Sequence[str], batch: list[str] | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run an ip/tc command (``batch``: lines for its ``-batch -``); raise with stderr on failure."""
    argv = [_tool(argv[0]), *argv[1:], *(["-batch", "-"] if batch is not None else [])]
    text = None if batch is None else "".join(line + "\n" for line in batch)
    result = subprocess.run(argv, input=text, capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}"
                           + (f"\ninput:\n{text}" if text else ""))
    return result


# --- units ----------------------------------------------------------------------------------

_RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
               "kibit": 2**10, "mibit": 2**20, "gibit": 2**30, "tibit": 2**40,
               "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12}
_TIME_UNITS = {"s": 1.0, "sec": 1.0, "ms": 1e-3, "msec": 1e-3, "us": 1e-6, "usec": 1e-6}
_QUANTITY = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?\d+)?)\s*([a-z]*)\s*$")


def _parse(value: str | float, units: dict[str, float], what: str, default_unit: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    else:
        match = _QUANTITY.match(str(value).lower())
        if not match or (match.group(2) or default_unit) not in units:
            raise ValueError(f"{what}: cannot parse {value!r} (units: {', '.join(units)})")
        number = float(match.group(1)) * units[match.group(2) or default_unit]
    if number < 0:
        raise ValueError(f"{what}: expected a non-negative value, got {value!r}")
    return number


def parse_rate(rate: str | float) -> int:
    """Bits per second from tc's notation ("200mbit", "1gbit", "10mbps" = bytes) or a number."""
    bits = int(_parse(rate, _RATE_UNITS, "rate", "bit"))
    if bits < 8000:
        raise ValueError(f"rate: expected at least 8kbit, got {rate!r}")
    return bits


def parse_delay(delay: str | float) -> float:
    """Seconds from "20ms", "1.5s", "300us" or a number of seconds."""
    return _parse(delay, _TIME_UNITS, "delay", "s")


def parse_loss(loss: str | float) -> float:
    """A probability from 0.01 or "1%"."""
    percent = isinstance(loss, str) and loss.strip().endswith("%")
    value = _parse(loss.strip()[:-1] if percent else loss, {"": 1.0}, "loss", "") / (100 if percent else 1)
    if value > 1:
        raise ValueError(f"loss: expected a probability in [0, 1] or a percentage, got {loss!r}")
    return value


@dataclass(frozen=True)
class Shaping:
    """One host link's shaping: ``rate`` in bit/s each way; ``delay`` (s) and ``loss`` on what
    the host sends."""
    rate: int | None = None
    delay: float = 0.0
    loss: float = 0.0

    @classmethod
    def of(cls, rate=None, delay=None, loss=None) -> "Shaping":
        return cls(None if rate is None else parse_rate(rate), 0.0 if delay is None else parse_delay(delay),
                   0.0 if loss is None else parse_loss(loss))

    def tbf(self, dev: str) -> list[str]:
        """tc lines for ``dev``'s root: a tbf whose bucket holds 1 ms of traffic but at least
        64 KiB (a whole GSO packet, so tbf need not split it) and whose queue holds 20 ms of
        traffic but at least 256 KiB (room for a TCP burst without drops at low rates)."""
        if not self.rate:
            return []
        per_second = self.rate / 8
        burst = max(64 * 1024, int(per_second * 1e-3))
        limit = burst + max(256 * 1024, int(per_second * 20e-3))
        return [f"qdisc add dev {dev} root handle 1: tbf rate {self.rate}bit burst {burst} limit {limit}"]


# --- probing, processes in namespaces, stale namespaces ----------------------------------------

@lru_cache(maxsize=None)
def netns_available(shaping: bool = False) -> tuple[bool, str]:
    """(True, "") if this process can make namespaces, veths and a bridge (and, with
    ``shaping``, tbf, clsact + u32 + mirred and TAP devices); else (False, why). Tries it
    for real, once per process."""
    if not os.path.isdir("/proc/self/ns"):
        return False, "network namespaces need Linux"
    for tool in ("ip", "tc") if shaping else ("ip",):
        if _which(tool) is None:
            return False, f"'{tool}' not found (Debian: apt-get install iproute2)"
    if os.geteuid() != 0:
        return False, "network namespaces need root (CAP_SYS_ADMIN and CAP_NET_ADMIN)"
    name = f"{PREFIX}{os.getpid()}-{next(_COUNTER)}-sw0"
    try:
        _cmd(["ip", "netns", "add", name])
        try:
            _cmd(["ip", "-n", name], ["link set lo up", "link add br0 type bridge",
                                      "link add a0 type veth peer name b0", "link set a0 master br0"])
            if shaping:
                _cmd(["ip", "-n", name, "tuntap", "add", "dev", "t0", "mode", "tap", "vnet_hdr"])
                _cmd(["tc", "-n", name], Shaping(rate=10**6).tbf("a0") + ["qdisc add dev b0 clsact",
                                                                          f"filter add dev b0 ingress {_MATCH_ALL} t0"])
        finally:
            _cmd(["ip", "netns", "del", name], check=False)
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        return False, f"cannot set up a network namespace: {error}"
    return True, ""


def require_netns(shaping: bool = False) -> None:
    """pytest.skip(reason) unless ``netns_available(shaping)``."""
    ok, reason = netns_available(shaping)
    if not ok:
        import pytest
        pytest.skip(reason)


def _netns_inode(name: str) -> int | None:
    try:
        return os.stat(os.path.join(NETNS_DIR, name)).st_ino
    except OSError:
        return None


def pids_in(inodes: set[int]) -> list[int]:
    """Pids of the live processes whose network namespace has one of these inodes."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if os.stat(f"/proc/{entry}/ns/net").st_ino in inodes:
                    pids.append(int(entry))
            except OSError:  # gone, or a zombie
                pass
    return pids


def _signal(pid: int, sig: int, group: bool = False) -> None:
    try:
        (os.killpg if group else os.kill)(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop(procs: Sequence[subprocess.Popen], inodes: set[int], grace: float) -> list[int]:
    """Stop ``procs`` (our children, each leading its process group) and every process inside
    the namespaces ``inodes``: SIGTERM, SIGKILL after ``grace`` s; reap ``procs``. Returns the
    pids still inside the namespaces at the end (none, unless stuck in the kernel)."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        for proc in procs:
            if proc.poll() is None:
                _signal(proc.pid, sig, group=True)
        for pid in pids_in(inodes):
            _signal(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if all(proc.poll() is not None for proc in procs) and not pids_in(inodes):
                return []
            time.sleep(0.01)
    return pids_in(inodes)


def cleanup_stale(grace: float = 0.5) -> list[str]:
    """Delete the harness's namespaces whose owning pid no longer exists (left by a run that
    was killed), after killing the processes still inside them. Returns their names."""
    try:
        names = [name for name in os.listdir(NETNS_DIR) if _NAME.match(name)]
    except OSError:
        return []
    stale = [name for name in names if not os.path.exists(f"/proc/{_NAME.match(name).group(1)}")]
    if stale:
        stop([], {ino for ino in map(_netns_inode, stale) if ino is not None}, grace)
        for name in stale:
            _cmd(["ip", "netns", "del", name], check=False)
    return stale


def _octets_taken() -> set[int]:
    """Third octets of 10.77.x.0/24 that are in use: by live Networks of any process (their
    switch namespace's name says which) or by an address of this machine's interfaces."""
    taken = set(_OCTETS_IN_USE)
    for name in os.listdir(NETNS_DIR) if os.path.isdir(NETNS_DIR) else []:
        match = _NAME.match(name)
        if match and match.group(3) is not None:
            taken.add(int(match.group(3)))
    for line in _cmd(["ip", "-4", "-o", "addr", "show"]).stdout.splitlines():
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
        inodes = {ino for ino in map(_netns_inode, res.namespaces) if ino is not None}
        res.leftovers = stop(res.procs + ([res.relay] if res.relay else []), inodes, res.grace)
        if res.relay is not None:
            res.relay.stdin.close()
            res.relay.stdout.close()
        if res.namespaces:  # the veths and the bridge go now, not when the kernel gets round to it
            links = [f"link del h{i}" for i in range(len(res.namespaces) - 1)] + ["link del br0"]
            _cmd(["ip", "-force", "-n", res.namespaces[0]], links, check=False)
        for name in reversed(res.namespaces):
            _cmd(["ip", "netns", "del", name], check=False)
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
            stem = f"{PREFIX}{os.getpid()}-{next(_COUNTER)}"
            self.hosts = [Host(i, f"{stem}-h{i}", str(self.subnet[i + 1])) for i in range(self.size)]
            self._res.namespaces.append(f"{stem}-sw{free[0]}")
            _cmd(["ip", "netns", "add", self._switch])
        for host in self.hosts:
            self._res.namespaces.append(host.name)
            _cmd(["ip", "netns", "add", host.name])
        lines = ["link set lo up", "link add br0 type bridge", "link set br0 up"]
        for i, host in enumerate(self.hosts):
            lines += [f"link add h{i} type veth peer name eth0 netns {host.name}", f"link set h{i} master br0",
                      f"link set h{i} up"]
        _cmd(["ip", "-n", self._switch], lines)
        for host in self.hosts:
            _cmd(["ip", "-n", host.name], ["link set lo up", f"addr add {host.addr}/24 dev eth0", "link set eth0 up"])

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
                _cmd(["tc", "-n", namespace], [line.replace("qdisc add", "qdisc replace") for line in new.tbf(dev)])
            elif old.rate:
                _cmd(["tc", "-n", namespace, "qdisc", "del", "dev", dev, "root"])
        if new.delay or new.loss or i in self._relayed:
            self._relay_link(i)
            self._relay_call(f"set {i} {new.delay!r} {new.loss!r}")
        self.shaping[i] = new
        return new

    def _relay_call(self, line: str) -> None:
        relay = self._res.relay
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
        _cmd(["tc", "-n", switch], [f"qdisc add dev d{i}b clsact", f"filter add dev d{i}b egress {_MATCH_ALL} h{i}"])
        _cmd(["ip", "-n", switch], [f"link set d{i}a up", f"link set d{i}b master br0", f"link set d{i}b up",
                                    f"link set h{i} nomaster"])
        _cmd(["tc", "-n", switch], [f"qdisc add dev h{i} clsact", f"filter add dev h{i} ingress {_MATCH_ALL} d{i}a"])
        self._relayed.add(i)

    def _check_started(self) -> None:
        if self._finalizer is None or not self._finalizer.alive:
            raise RuntimeError("Network is not running (use it as a context manager)")

    @staticmethod
    def _spawn(namespace: str, argv: Sequence[str], **popen_kwargs) -> subprocess.Popen:
        return subprocess.Popen([_tool("ip"), "netns", "exec", namespace, *argv], start_new_session=True,
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
                _signal(proc.pid, signal.SIGKILL, group=True)
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
