"""The launcher, ``pydist-run`` (torchrun's equivalent): see :mod:`pydist.run.cli`.

Modules: ``cli`` (arguments -> LaunchConfig), ``config`` (worker argv and environment),
``endpoint`` (host or reach the job's store; ``turn``, ``store_probe`` and ``holders``: who
holds its port), ``agent_rendezvous`` (agents meet in rounds), ``agent`` (rounds, restarts,
exit code), ``round_run`` (one round's workers: the agent's round), ``workers`` (process
groups), ``output`` (line-prefixed forwarding), ``logs`` (--log-dir, -r, -t), ``failure``
(root-cause summary), ``_site`` (records workers' uncaught exceptions), ``run_path``
(--run-path).
"""
