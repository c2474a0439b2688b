"""What an input may be: sizes and spacings the readers (files and DICOM series) accept."""

#: most voxels a file may declare in all (every frame of a 4D cine), about 256 MB as float32
MAX_FILE_VOXELS = 64 * 2 ** 20
#: most voxels of the volume that is segmented (one frame), about 1 GB of working memory
MAX_VOLUME_VOXELS = 16 * 2 ** 20
#: smallest in-plane size (pixels) accepted as an image rather than a mistake
MIN_INPLANE = 16
#: plausible pixel spacing (mm) for MRI in-plane, and between slices
INPLANE_SPACING_MM = (0.05, 10.0)
SLICE_SPACING_MM = (0.05, 100.0)
