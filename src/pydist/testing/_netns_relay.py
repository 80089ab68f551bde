"""The delay/loss relay of ``pydist.testing.netns``: a script (``python -I _netns_relay.py``)
run in the switch namespace, between a host's veth and its bridge port (see netns' docstring).
Standalone: imports nothing from pydist."""
import itertools
import os
import time

_TUNSETIFF, _TUNSETOFFLOAD = 0x400454CA, 0x400454D0
_IFF_TAP, _IFF_NO_PI, _IFF_VNET_HDR = 0x0002, 0x1000, 0x4000
_TUN_F_CSUM_TSO = 0x01 | 0x02 | 0x04 | 0x08  # checksum, TSO4, TSO6, TSO_ECN: whole GSO frames
_RELAY_LIMIT = 100_000  # frames held at once; more are dropped, like netem's limit


def _relay_main() -> None:
    """Serve lines on stdin, answering "ok" or "error ..." on stdout; exit at EOF.
    ``add I``: make TAPs d<I>a (read) and d<I>b (written); ``set I DELAY LOSS``: frames read
    from d<I>a go to d<I>b DELAY s later, each dropped with probability LOSS (TSO is off while
    LOSS > 0, so that a frame is one packet)."""
    import fcntl
    import heapq
    import random
    import select
    import struct

    links: dict[int, list] = {}  # i -> [fd_in, fd_out, delay, loss]
    by_fd: dict[int, list] = {}
    held: list[tuple[float, int, int, bytes]] = []
    sequence = itertools.count()
    poller = select.poll()
    poller.register(0, select.POLLIN)
    pending = b""

    def tap(name: str) -> int:
        fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH22x", name.encode(), _IFF_TAP | _IFF_NO_PI | _IFF_VNET_HDR))
        fcntl.ioctl(fd, _TUNSETOFFLOAD, _TUN_F_CSUM_TSO)
        return fd

    def command(words: list[str]) -> None:
        i = int(words[1])
        if words[0] == "add":
            if i not in links:
                links[i] = [tap(f"d{i}a"), tap(f"d{i}b"), 0.0, 0.0]
                by_fd[links[i][0]] = links[i]
                poller.register(links[i][0], select.POLLIN)
        elif words[0] == "set":
            links[i][2:] = [float(words[2]), float(words[3])]
            fcntl.ioctl(links[i][0], _TUNSETOFFLOAD, 0 if links[i][3] else _TUN_F_CSUM_TSO)
        else:
            raise ValueError(f"bad command {words}")

    while True:
        # real time: the relay delays packets as a link would
        timeout = max(0.0, (held[0][0] - time.monotonic()) * 1e3) if held else None
        for fd, _ in poller.poll(timeout):
            if fd == 0:
                data = os.read(0, 4096)
                if not data:
                    return
                *lines, pending = (pending + data).split(b"\n")
                for line in lines:
                    try:
                        command(line.decode().split())
                        os.write(1, b"ok\n")
                    except (OSError, ValueError, IndexError, KeyError) as error:
                        os.write(1, f"error {type(error).__name__}: {error}\n".encode())
                continue
            fd_in, fd_out, delay, loss = by_fd[fd]
            now = time.monotonic()
            for _ in range(64):
                try:
                    frame = os.read(fd_in, 65536 + 1024)
                except BlockingIOError:
                    break
                if (not loss or random.random() >= loss) and len(held) < _RELAY_LIMIT:
                    heapq.heappush(held, (now + delay, next(sequence), fd_out, frame))
        now = time.monotonic()
        while held and held[0][0] <= now:
            _, _, fd_out, frame = heapq.heappop(held)
            try:
                os.write(fd_out, frame)
            except OSError:  # the kernel refused the frame: it is lost, as on a wire
                pass


if __name__ == "__main__":
    _relay_main()
