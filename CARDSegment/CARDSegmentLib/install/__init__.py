"""First use: the packages the engine needs (:mod:`.dependencies`, what is missing;
:mod:`.packages`, installing them in Slicer after asking; :mod:`.network`, whether the package
index can be reached), the bundle choice (:mod:`.bundles`),
the research-only acknowledgement of the shipped weights (:mod:`.acknowledgement`) and the
module's sample data (:mod:`.sampledata`). Below the runs; nothing here knows about MRML outputs.
"""
