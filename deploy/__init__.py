"""Load time: the package format and the C++ runtime's Python face (here; the runtime itself in cpp/), with what its
extension calls back (Triton's interpreter, kernel rebuilds). Convert-time code lives in packaging/ (building a
package, and conversion's reference interpreter of plans, interpreter.py) and serving in serving/; neither is
imported by what is here (tests/test_structure.py)."""
