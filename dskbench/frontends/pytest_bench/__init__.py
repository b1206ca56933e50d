"""The pytest-benchmark front end (bench/conftest.py): pre-measured samples replayed into
pytest-benchmark's statistics (replay.py)."""
