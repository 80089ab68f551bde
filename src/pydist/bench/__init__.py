"""``pydist-bench``: nccl-tests-style benchmarks of pydist's collectives.

The CLI process (:mod:`.cli`) parses the options, then for each backend (pydist, and the
ones named by ``--compare``) starts N worker processes (:mod:`.launch`, :mod:`.backends`)
that time the operation at every size (:mod:`.timing`, :mod:`.comms`, :mod:`.worker`) and
stream their results back as JSON lines on a pipe. The results are printed as a table or
as JSON (:mod:`.report`) and optionally plotted (:mod:`.plot`). Size specs and the
per-operation byte counts and bus-bandwidth factors live in :mod:`.sizes` and :mod:`.ops`;
what both modes share (backends to run, plan, header, output) in :mod:`.session`.

Started inside an already launched job (pydist-run, torchrun, mpiexec: RANK/WORLD_SIZE or
the MPI launcher's variables set) it starts no workers: every process is one rank, runs
the backends in turn and rank 0 prints the table (:mod:`.injob`).
"""
