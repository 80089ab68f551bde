"""torch programs the tests run as scripts on gloo and on pydist (tests/test_torch_programs.py);
``_harness`` is their shared part, imported as a sibling."""
