"""The GPU run's pieces (``Training/gpu/run.py`` is the entry script; ``build_pack.py``,
``import_runs.py`` and ``choose_reference.py`` are scripts of their own).

Layers, each importing only those below it:

- :mod:`gpu.run`          the command line and the parent that starts one process per job
- :mod:`gpu.train_job`    one job's training loop (checkpoints, validation, log)
- :mod:`gpu.checks`       the engine checks and timings written to ``engine.json``
- :mod:`gpu.validation`   Dice on the pack's validation volumes with the engine's sampler
- :mod:`gpu.device_data`  the pack on the device, augmentation and noisy inputs drawn there
- :mod:`gpu.outputs`      the run's files: ``log.jsonl`` lines and fp16 safetensors
- :mod:`gpu.jobs`         the jobs table, checkpoint files, smoke steps, learning-rate schedule
- :mod:`gpu.engine_env`   importing the engine where SimpleITK is absent
"""
