"""A library of one op, registered when this module is imported, as torchvision registers torchvision::nms: the
tests' stand-in for an op a package calls that torch itself does not have."""
import torch

LIBRARY = torch.library.Library("j2t_test_ops", "DEF")
LIBRARY.define("scaled_add(Tensor x, Tensor y, float alpha) -> Tensor")
LIBRARY.impl("scaled_add", lambda x, y, alpha: x + alpha * y, "CompositeExplicitAutograd")
