"""What goes in and out: image formats and their headers, DICOM series, the checked volume,
the slice grid the networks see, and the atomic output folder."""
