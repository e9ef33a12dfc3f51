"""The benchmarks: run each from the repository root as ``.venv/bin/python -m bench.<name>``; each writes its
figures through ``bench.results_file.save_results`` into ``bench/results/<name>.json``."""
