"""Test helpers shared by the test modules (``from helpers.cli import run_lvrl``).

Test modules import from here and never from each other. The ``resume_probe`` and ``sp_probe``
callbacks are loaded by configs as ``helpers.resume_probe.StepRecorder`` etc.: in-process runs
find them through pytest's ``pythonpath``, subprocesses through :data:`helpers.cli.PROBES_ENV`.
"""
