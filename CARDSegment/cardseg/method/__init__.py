"""The method of the paper, as pure tensor code (no files, no bundles): the categorical diffusion
(Eqs. 1, 3), the reverse trajectory with its Jensen-Shannon disagreement and TAC (Eqs. 6, 7), the
calibrators (CARD, Eqs. 4, 8, and every baseline), the denoising networks, and the execution
schedules of the trajectory on a GPU. Imports only :mod:`cardseg.base`."""
