"""Load time: the package format and the C++ runtime's Python face (here; the runtime itself in cpp/), with the kernel
loaders its extension calls back, and conversion's reference interpreter (executor.py). Convert-time packaging lives
in packaging/ and serving in serving/; neither is imported by what is here (tests/test_structure.py)."""
