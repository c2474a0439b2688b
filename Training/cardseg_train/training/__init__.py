"""Training one denoiser: configuration, objective, step pieces, the loop, run folders and bundle export."""
