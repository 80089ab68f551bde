"""Not imported: holds the sitecustomize that pydist-run puts first on its workers PYTHONPATH."""
