"""The package format, the Python runtime, and (later) the C++ loader."""
