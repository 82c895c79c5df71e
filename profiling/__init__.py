"""The benchmarks: drivers, summaries, and the lab (:mod:`profiling.lab`) that only they use.

How the lab and the examples are imported: from the repository root, as the packages
``profiling.lab`` and ``examples.<name>`` (``examples/`` is a namespace package: its scripts stay
plain scripts). So the one rule is that the repository root is on ``sys.path``:

* commands run from the root with ``python -m``, which puts the current folder first, e.g.
  ``python -m profiling.lab.train --steps 40`` (the shell drivers ``cd`` to the root first);
* pytest has the root in ``pythonpath`` (``[tool.pytest.ini_options]`` in pyproject.toml);
* the ranks that the lab starts inherit it through ``PYTHONPATH`` (:mod:`profiling.lab` adds it).

The scripts directly in this folder (``python profiling/render_results.py`` and the like) import
their neighbours by the script's own folder, as before. The installed package never imports
anything from here.
"""
