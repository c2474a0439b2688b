"""The GPU run's pieces (``Training/cardseg_gpu/run.py`` is the entry script; ``build_pack.py``,
``import_runs.py`` and ``choose_reference.py`` are scripts of their own).

Layers, each importing only those below it:

- :mod:`cardseg_gpu.run`          the command line and the parent that starts one process per job
- :mod:`cardseg_gpu.train_job`    one job's training loop (checkpoints, validation, log)
- :mod:`cardseg_gpu.checks`       the engine checks and timings written to ``engine.json``
- :mod:`cardseg_gpu.validation`   Dice on the pack's validation volumes with the engine's sampler
- :mod:`cardseg_gpu.device_data`  the pack on the device, augmentation and noisy inputs drawn there
- :mod:`cardseg_gpu.outputs`      the run's files: ``log.jsonl`` lines and fp16 safetensors
- :mod:`cardseg_gpu.jobs`         the jobs table, checkpoint files, smoke steps, learning-rate schedule
- :mod:`cardseg_gpu.engine_env`   importing the engine where SimpleITK is absent
"""
