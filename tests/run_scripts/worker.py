"""Worker script for tests/test_launcher_run.py: ``worker.py ACTION [args]``.

Every action first records the worker's pid as ``$PIDDIR/<rank>`` (when PIDDIR is set) so
the test can check that no worker outlives the launcher.

- env: print ``ENV <json of the launcher-set variables>``.
- echo ARGS...: print ``ARGS <json argv>``, a stderr line, and a partial stdout line.
- spam N: print N long lines made of the rank digit (interleaving check).
- fail MODE RANK: rank RANK fails after 0.5 s (MODE raise | sigkill | exit3); others sleep 60 s.
- group-fail MODE: every rank joins a pydist group; rank 1 fails at once (MODE raise: a
  RuntimeError "boom"; exit3: sys.exit(3)), then, at exit, leaves the group and lingers
  until the launcher stops it; rank 0's all_reduce fails, as an echo of rank 1's failure,
  and rank 0 exits first.
- late-collective: every rank joins a pydist group and makes a new_group of ranks 0 and 1
  (whose arena, unlike the default group's, is made at its first collective); rank 0 enters
  its first all_reduce (it creates the group's shared memory), rank 1 sleeps 60 s instead
  (never maps it).
- sleep [ignore-term] [grandchild]: sleep 60 s; optionally ignore SIGTERM / start a grandchild
  whose pid goes to ``$PIDDIR/<rank>.child``.
- store: set/get a key in the agent's TCPStore through MASTER_ADDR/MASTER_PORT.
- rendezvous: the same through pydist's env:// rendezvous (which uses the agent's store).
- flaky RANK: print ENV; in the first attempt (TORCHELASTIC_RESTART_COUNT=0) rank RANK
  raises ValueError after 0.3 s and the others sleep 60 s; later attempts exit 0.
- until-world N: print ENV; exit 0 once WORLD_SIZE >= N, else sleep 60 s.
"""
import atexit
import json
import os
import signal
import subprocess
import sys
import threading
import time

VARS = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
        "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE",
        "OMP_NUM_THREADS"]


def record(name: str, pid: int) -> None:
    if os.environ.get("PIDDIR"):
        with open(os.path.join(os.environ["PIDDIR"], name), "w") as f:
            f.write(str(pid))


def main() -> None:
    rank = int(os.environ["RANK"])
    record(str(rank), os.getpid())
    action, args = sys.argv[1], sys.argv[2:]
    if action == "env":
        print("ENV " + json.dumps({k: os.environ.get(k) for k in VARS}))
    elif action == "echo":
        print("ARGS " + json.dumps(args))
        print(f"to stderr from {rank}", file=sys.stderr)
        sys.stdout.write(f"partial {rank}")
    elif action == "spam":
        for _ in range(int(args[0])):
            sys.stdout.write(str(rank) * 3000 + "\n")
    elif action == "fail":
        mode, failing = args[0], args[1]  # failing: a rank, or "all"
        if failing in ("all", str(rank)):
            time.sleep(0.5)
            if mode == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            if mode == "exit3":
                sys.exit(3)
            raise ValueError(f"boom from rank {rank}")
        time.sleep(60)
    elif action == "group-fail":
        import numpy as np

        import pydist as dist

        dist.init_process_group("pydist")
        if rank == 1:
            @atexit.register
            def leave_then_linger():  # at exit: after the failure below was recorded
                dist.destroy_process_group()  # rank 0's all_reduce fails now
                threading.Event().wait()  # an exit-time cleanup outlasting rank 0

            if args[0] == "exit3":
                sys.exit(3)
            raise RuntimeError("boom")
        dist.all_reduce(np.ones(4, np.float32))
        time.sleep(60)
    elif action == "shrink-on-failure":  # rank 1 is killed; the others shrink and go on
        import numpy as np

        import pydist as dist

        dist.init_process_group("pydist")
        dist.barrier()
        if rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        buf = np.ones(4, np.float32)
        try:
            while True:
                dist.all_reduce(buf)
                buf[:] = 1
        except dist.DistError as error:
            dist.shrink_group(sorted(error.dead_ranks))
        buf[:] = 1
        dist.all_reduce(buf)
        print(f"rank {rank} recovered: rank {dist.get_rank()} of {dist.get_world_size()}, sum {buf[0]:g}", flush=True)
        dist.destroy_process_group()
    elif action == "late-collective":
        import numpy as np

        import pydist as dist

        dist.init_process_group("pydist")
        pair = dist.new_group([0, 1])
        if rank == 0:
            dist.all_reduce(np.ones(4, np.float32), group=pair)
        time.sleep(60)
    elif action == "sleep":
        if "ignore-term" in args:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if "grandchild" in args:
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            record(f"{rank}.child", child.pid)
        print("ready", flush=True)
        time.sleep(60)
    elif action in ("store", "rendezvous"):
        if action == "store":
            from pydist.store import TCPStore

            store = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
        else:
            from datetime import timedelta

            from pydist.rendezvous import rendezvous

            store, _, _ = rendezvous("env://", -1, -1, timedelta(seconds=30))
        store.set(f"key{rank}", f"value{rank}")
        world = int(os.environ["WORLD_SIZE"])
        store.wait([f"key{r}" for r in range(world)])
        got = [store.get(f"key{r}").decode() for r in range(world)]
        print("STORE " + json.dumps({"port": os.environ["MASTER_PORT"], "values": got}))
        store.close()
    elif action == "flaky":
        print("ENV " + json.dumps({k: os.environ.get(k) for k in VARS}), flush=True)
        if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
            if rank == int(args[0]):
                time.sleep(0.3)
                raise ValueError(f"boom from rank {rank}")
            time.sleep(60)
    elif action == "until-world":
        print("ENV " + json.dumps({k: os.environ.get(k) for k in VARS}), flush=True)
        if int(os.environ["WORLD_SIZE"]) < int(args[0]):
            time.sleep(60)
    else:
        raise SystemExit(f"unknown action {action}")


if __name__ == "__main__":
    main()
