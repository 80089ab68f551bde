"""The seeds' example programs, written for pydist (tests/test_examples_seed_programs.py runs them).

``launch`` holds the seeds' ``init_process`` and their spawn-and-join main block; the
``seed000_*`` / ``seed001_*`` modules are the seed examples (torch and numpy versions),
``sweep`` generalises them to any world size for ``pydist.testing.run_processes``.
Every program file also runs as a script: ``python tests/seed_programs/seed001_torch.py``.
"""
