"""Imported last by the fork server that starts process-ranks (pydist.testing.processes.preload):
moves every object the modules imported before it made into the garbage collector's permanent
generation (``gc.freeze``). A forked rank's first full collection would otherwise walk them all,
writing to each and so copying every page of the server's heap into the rank: with torch
preloaded, ~40 MB and ~0.1 s a rank (8 ranks: init_process_group ~1 s instead of ~0.15 s here)."""
import gc

gc.freeze()
