"""Segmentation quality of a bundle on labelled volumes."""
