"""Every torch.distributed.TCPStore client method against the store at HOST:PORT, in a
fixed order; prints one JSON list of [label, outcome] (bytes as latin-1 text, errors as
[exception type, first line of the message]). Run against a pydist server and against
torch's own master, the two outputs must be equal.

Usage: torch_store_sequence.py HOST PORT
"""
import json
import sys
from datetime import timedelta

import torch.distributed as dist

host, port = sys.argv[1], int(sys.argv[2])
store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=1))
outcomes = []


def plain(value):
    if isinstance(value, bytes):
        return value.decode("latin-1")
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value


def step(label, call):
    try:
        outcome = plain(call())
    except Exception as e:  # noqa: BLE001 - the error is the outcome
        outcome = [type(e).__name__, str(e).splitlines()[0]]
    outcomes.append([label, outcome])


big = bytes(range(256)) * 4096 + b"\x00end"  # 1 MiB and more: spans many TCP segments
step("set", lambda: store.set("k", "v"))
step("get", lambda: store.get("k"))
step("set big", lambda: store.set("big", big))
step("get big", lambda: store.get("big") == big)
step("set empty", lambda: store.set("empty", b""))
step("get empty", lambda: store.get("empty"))
step("set unicode", lambda: store.set("ключ/λ", "значение"))
step("get unicode", lambda: store.get("ключ/λ"))
step("add new", lambda: store.add("n", 5))
step("add negative", lambda: store.add("n", -7))
step("add zero", lambda: store.add("n", 0))
step("get counter", lambda: store.get("n"))
step("set int-ish", lambda: store.set("num", " 12abc"))
step("add int-ish", lambda: store.add("num", 1))
step("compare_set missing, empty expected", lambda: store.compare_set("cs1", "", "new"))
step("compare_set missing, other expected", lambda: store.compare_set("cs2", "x", "new"))
step("check cs2", lambda: store.check(["cs2"]))
step("compare_set match", lambda: store.compare_set("cs1", "new", "newer"))
step("compare_set mismatch", lambda: store.compare_set("cs1", "nope", "never"))
step("check", lambda: store.check(["k", "n"]))
step("check missing", lambda: store.check(["k", "missing"]))
step("check none", lambda: store.check([]))
step("wait present", lambda: store.wait(["k", "n"]))
step("wait timeout", lambda: store.wait(["k", "missing"], timedelta(milliseconds=300)))
step("get after a timed-out wait", lambda: store.get("k"))
step("get timeout", lambda: store.get("never"))
step("num_keys", lambda: store.num_keys())
step("delete_key", lambda: store.delete_key("k"))
step("delete_key again", lambda: store.delete_key("k"))
step("check deleted", lambda: store.check(["k"]))
step("append new", lambda: store.append("log", "a"))
step("append more", lambda: store.append("log", "bc"))
step("get appended", lambda: store.get("log"))
step("multi_set", lambda: store.multi_set(["m1", "m2"], ["v1", b"v\x002"]))
step("multi_get", lambda: store.multi_get(["m1", "m2", "log"]))
step("multi_get none", lambda: store.multi_get([]))
step("multi_get timeout", lambda: store.multi_get(["m1", "missing"]))
step("list_keys", lambda: sorted(store.list_keys()))
step("queue_push", lambda: store.queue_push("q", "1"))
step("queue_push again", lambda: store.queue_push("q", b"2"))
step("queue_len", lambda: store.queue_len("q"))
step("check queue", lambda: store.check(["q"]))
step("num_keys with a queue", lambda: store.num_keys())
step("queue_pop", lambda: store.queue_pop("q"))
step("queue_pop non-blocking", lambda: store.queue_pop("q", block=False))
step("queue_pop empty", lambda: store.queue_pop("q", block=False))
step("queue_pop blocking timeout", lambda: store.queue_pop("q"))
step("queue_len empty", lambda: store.queue_len("q"))
step("barrier of one", lambda: store.barrier("bar", 1, timedelta(seconds=1)))
step("barrier timeout", lambda: store.barrier("bar2", 2, timedelta(milliseconds=300)))
step("get barrier counter", lambda: store.get("bar2"))
step("clone", lambda: store.clone().get("log"))
step("worker count",
     lambda: dist.TCPStore(host, port, world_size=3, is_master=False, timeout=timedelta(seconds=1)).port == port)
step("num_keys with init/", lambda: store.num_keys())
step("list_keys with init/", lambda: sorted(store.list_keys()))
step("add to init/ is separate from /init/", lambda: store.add("init/", 10))
print(json.dumps(outcomes))
