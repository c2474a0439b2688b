"""cardseg_train: datasets, training, calibration fitting and evaluation for CARDSegment.

Imports :mod:`cardseg`; the engine never imports this package (its CLI reaches
``train``, ``fit-calibration`` and ``evaluate`` through :mod:`cardseg_train.commands.train`, lazily).

Modules: :mod:`.datasets` (ACDC HDF5, ACDC NIfTI and image/label-pair loaders; slices mapped
onto the network grid exactly as inference maps them), :mod:`.augment` (batch augmentation in
torch), :mod:`.losses` (variational KL + CE + Dice + boundary), :mod:`.train` (the training
loop, checkpoints, resume, bundle export) and :mod:`.cli` (``cardseg train`` and
``cardseg train export``).
"""
