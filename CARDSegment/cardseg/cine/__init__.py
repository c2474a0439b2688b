"""A cine's cardiac measures, pure (numpy/SciPy, no I/O): the end-diastolic and end-systolic frames
from the volume curves, the curves' plausibility, heart rate and cardiac output from the temporal
resolution, and the LV's regional wall thickness over the AHA segments."""
