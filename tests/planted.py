"""What an attacker plants: a small shared library whose constructor, run by any dlopen of it, appends a line to
the file named by $J2T_PLANTED_MARK. A test sets the variable and asserts the file never appears."""
from __future__ import annotations

import shutil
import subprocess

import pytest

SOURCE = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void planted(void) {
  const char* mark = getenv("J2T_PLANTED_MARK");
  FILE* f = mark ? fopen(mark, "a") : NULL;
  if (f) { fputs("ran\n", f); fclose(f); }
}
"""


def planted_library(folder) -> bytes:
    """The library's bytes (about 6 KB: smaller than a package's kernel library, so it can be written over one)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("needs a C compiler to make the planted library")
    source, library = folder / "planted.c", folder / "planted.so"
    source.write_text(SOURCE)
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-s", "-Wl,-z,max-page-size=4096", "-Wl,-z,noseparate-code",
                    "-o", str(library), str(source)], check=True)
    return library.read_bytes()
