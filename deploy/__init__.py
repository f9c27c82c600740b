"""Load time: the package format and the Python runtime (here; the C++ runtime in cpp/). Convert-time packaging
lives in packaging/ and serving in serving/; neither is imported by what is here (tests/test_structure.py)."""
