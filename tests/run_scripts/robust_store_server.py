"""A TCPStore server in a process of its own, for tests/test_store_hostile_clients.py (so that its
memory can be read from /proc/<pid>/status): prints ``PORT <n>``, serves until its stdin
closes, then closes the store and exits."""
import sys
from datetime import timedelta

import pydist

store = pydist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30))
print(f"PORT {store.port}", flush=True)
sys.stdin.read()
store.close()
