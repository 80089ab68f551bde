"""Run N ranks for tests and examples: as threads of this process, or as processes.

``run_threads(n, fn, ...)`` gives each thread a World of its own, so ``fn(rank, size)``
uses the public API (``pydist.all_reduce(...)``) unchanged, over the in-process loopback
transport (the reference) or over real tcp sockets. ``run_processes(n, fn, ...)`` starts
real processes that rendezvous through env://, tcp://, file:// or a TCPStore. Both return
the ranks' results in rank order and raise the first failure, naming its rank; a rank
that does not finish in time makes them raise TimeoutError (stacks of thread-ranks are
in the message) after stopping process-ranks by pid. ``stop_processes(procs, grace)``
is that stop: join, then SIGKILL by pid and reap what still runs.
"""
from .processes import free_port, run_processes, stop_processes
from .threads import run_threads

__all__ = ["free_port", "run_processes", "run_threads", "stop_processes"]
