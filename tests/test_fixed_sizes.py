"""A size the package fixed at conversion that a call changes is one error: SizeChangedError (an
InputError) with the same message, raised where a kernel meets the size (the C++ runtime raised a StepError)."""
import pytest
import torch

import jit2triton
from jit2triton.errors import SizeChangedError
from call_programs import RowsByValue


def test_a_changed_size_is_a_size_changed_error(tmp_path):
    torch.manual_seed(0)
    converted = jit2triton.convert(torch.jit.script(RowsByValue()), (torch.randn(10), 5))
    # as a package from before ints were fixed at the boundary: the kernel meets the size the value sets
    del converted._contents.manifest["signature"]["inputs"][1]["fixed"]
    converted.save(tmp_path / "m.j2t")
    loaded = jit2triton.load(tmp_path / "m.j2t")
    with pytest.raises(SizeChangedError, match=r"kernel input 0 has shape \[2, 5\], but the package was converted "
                                               r"for \[5, 2\]: a size the package fixed at conversion changed"):
        loaded(torch.randn(10), 2)
