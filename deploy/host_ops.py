"""Ops the runtime runs itself: TorchScript's list, tuple, dict and scalar bookkeeping.

These are the ops whose schemas are generic (`t[]`, `Dict(t, v)`) or that mutate a Python container in place,
which `torch.ops` cannot call from Python with the right semantics. Each is a small function over Python values;
an op with several outputs returns a sequence.
"""
from __future__ import annotations

import math
import operator
import warnings
from typing import Any, Callable

import torch

from jit2triton.errors import ModelRaisedError


def _append(items: list, item: Any) -> list:
    items.append(item)
    return items


def _set_item(container, key, value):
    container[key] = value
    return container


# The keys a TorchScript dict hashes (c10's IValue::hash; a bool is an int): another, such as None, is refused there
DICT_KEYS = (str, int, float, complex, torch.Tensor)


def _dict_construct(*kv: Any) -> dict:
    keys = kv[::2]
    for key in keys:
        if not isinstance(key, DICT_KEYS):
            raise TypeError(f"a dict key is a str, int, float, bool, complex or Tensor, not {type(key).__name__}")
    return dict(zip(keys, kv[1::2]))


def _insert(items: list, index: int, item: Any) -> None:
    items.insert(index, item)


def _extend(items: list, more: list) -> None:
    items.extend(more)


def _pop(items: list, index: int = -1) -> Any:
    return items.pop(index)


def _clear(items) -> None:
    items.clear()


def _raise(message: Any = "", *rest: Any) -> None:
    raise ModelRaisedError(f"the model raised an exception: {message}")


def _slice_list(items: list, start: Any = None, end: Any = None, step: int = 1) -> list:
    return items[start:end:step]


def _range_length(lo: int, hi: int, step: int) -> int:
    return max(0, -(-(hi - lo) // step)) if step > 0 else max(0, -(-(lo - hi) // -step))


def _derive_index(index: int, start: int, step: int) -> int:
    return start + index * step


def _dict_get(d: dict, key: Any, default: Any = None) -> Any:
    return d.get(key, default)


def _num_to_tensor(number: Any) -> torch.Tensor:
    return torch.scalar_tensor(number, dtype=torch.int64 if isinstance(number, int) and not isinstance(
        number, bool) else (torch.bool if isinstance(number, bool) else torch.float64))


def _format(fmt: str, *args: Any) -> str:
    """TorchScript's aten::format: each "{}" in turn takes the next argument's text and nothing else is read.
    Python's str.format would evaluate the attribute and index lookups a package's format string may hold
    ("{0.__class__...}"), so a plan could read the process's memory."""
    pieces = fmt.split("{}")
    if len(pieces) - 1 > len(args):
        raise ValueError(f"Too few arguments for format string: {fmt}")
    return pieces[0] + "".join(print_text(arg) + piece for arg, piece in zip(args, pieces[1:]))


# c10::ScalarType's order: a plan holds a dtype argument as TorchScript does, as its index here
_SCALAR_TYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.float32,
                 torch.float64, torch.complex32, torch.complex64, torch.complex128, torch.bool, torch.qint8,
                 torch.quint8, torch.qint32, torch.bfloat16)
_SCALAR_CODES = {dtype: code for code, dtype in enumerate(_SCALAR_TYPES)}


def _dtype(dtype: Any) -> Any:
    return _SCALAR_TYPES[dtype] if isinstance(dtype, int) and not isinstance(dtype, bool) else dtype


def _same_int(a: Any, b: Any) -> bool:
    """aten::eq.int as TorchScript runs it, where a dtype is an int: prim::dtype gives torch's dtype here, and a
    scripted `mask.dtype != torch.bool` compares it with the constant 11 (MultiheadAttention's key_padding_mask
    check raised on a bool mask)."""
    return _dtype_code(a) == _dtype_code(b)


def _dtype_code(x: Any) -> Any:
    return _SCALAR_CODES.get(x, x) if isinstance(x, torch.dtype) else x


def _warn(message: Any, stacklevel: int = 2) -> None:
    """TorchScript's warnings.warn in Python: a UserWarning, shown once per place as Python's filters decide."""
    warnings.warn(str(message), UserWarning, stacklevel=2)


def _print(*args: Any) -> None:
    """TorchScript's print: its arguments' text, separated by spaces, on stdout."""
    print(*map(print_text, args))


def print_text(x: Any) -> str:
    """A value as TorchScript's print writes it (deploy/cpp/src/host_ops.cpp's print_text): a whole float in int64's
    range as its digits and a point ("2."), another in 17 significant digits; strings bare, in containers too."""
    if isinstance(x, float):
        whole = -2.0 ** 63 < x < 2.0 ** 63 and x == int(x)
        return f"{int(x)}." if whole else "%.17g" % x
    if isinstance(x, list):
        return "[" + ", ".join(map(print_text, x)) + "]"
    if isinstance(x, tuple):
        return "(" + ", ".join(map(print_text, x)) + ("," if len(x) == 1 else "") + ")"
    if isinstance(x, dict):
        return "{" + ", ".join(f"{print_text(k)}: {print_text(v)}" for k, v in x.items()) + "}"
    return str(x)


def _unwrap_optional(x: Any) -> Any:
    if x is None:
        raise ModelRaisedError("the model raised an exception: unwrapping an Optional that is None")
    return x


def _extend_in_place(items: list, more: list) -> list:
    items.extend(more)
    return items


def _repeat_in_place(items: list, times: int) -> list:
    items[:] = items * times
    return items


def _sort_in_place(items: list, reverse: bool = False) -> None:
    items.sort(reverse=reverse)


def _from_tensor(convert: Callable[[torch.Tensor], Any]) -> Callable[[Any], Any]:
    """aten::Int.Tensor and its kin, which take a Tensor only (as the C++ runtime's TorchScript operators do):
    Python's `bool(None)` is False and `int(3)` is 3, so a plan that passes another value would run here and fail
    there."""
    def scalar(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"Expected Tensor but got {type(t).__name__}")
        return convert(t)
    return scalar


def _int_floordiv(a, b):
    return a // b


def _not(x: bool) -> bool:
    """`not x` of a bool only, as TorchScript's (and the C++ runtime's) aten::__not__ takes: Python's `not` of a
    tensor or a list would run where they refuse."""
    if type(x) is not bool:
        raise TypeError(f"aten::__not__ takes a bool, and was given {type(x).__name__}")
    return not x


HOST_OPS: dict[str, Callable] = {
    "prim::ListConstruct": lambda *items: list(items),
    "prim::ListUnpack": lambda items: items,
    "prim::TupleConstruct": lambda *items: tuple(items),
    "prim::TupleUnpack": lambda items: items,
    "prim::TupleIndex": operator.getitem,
    "prim::DictConstruct": _dict_construct,
    "prim::unchecked_cast": lambda x: x,
    "prim::Uninitialized": lambda: None,
    "prim::RaiseException": _raise,
    "prim::NumToTensor": _num_to_tensor,
    "prim::device": lambda t: t.device,
    "prim::dtype": lambda t: t.dtype,
    "prim::layout": lambda t: t.layout,
    "prim::shape": lambda t: list(t.shape),
    "prim::is_cuda": lambda t: t.is_cuda,
    "prim::data": lambda t: t,
    "prim::min": min,
    "prim::tolist": lambda t, dim, elem_type: t.tolist(),  # (torch.ops cannot call its vararg schema)
    "prim::type": lambda device: device.type,
    "aten::as_tensor.list": lambda data, dtype=None, device=None: torch.as_tensor(data, dtype=_dtype(dtype),
                                                                                  device=device),
    "aten::tensor": lambda data, dtype=None, device=None, requires_grad=False: torch.tensor(
        data, dtype=_dtype(dtype), device=device, requires_grad=requires_grad),
    "prim::max": max,
    "prim::abs": abs,
    "aten::__getitem__.t": operator.getitem,
    "aten::__getitem__.str": operator.getitem,
    "aten::append.t": _append,
    "aten::len.t": len,
    "aten::len.str": len,
    "aten::_set_item.t": _set_item,
    "aten::insert.t": _insert,
    "aten::extend.t": _extend,
    "aten::pop.t": _pop,
    "aten::clear.t": _clear,
    "aten::list.t": list,
    "aten::copy.t": list,
    "aten::slice.t": _slice_list,
    "aten::add.t": operator.add,
    "aten::__contains__.int_list": lambda items, x: x in items,
    "aten::__contains__.float_list": lambda items, x: x in items,
    "aten::__contains__.str_list": lambda items, x: x in items,
    "aten::__is__": operator.is_,
    "aten::__isnot__": operator.is_not,
    "aten::__not__": _not,
    "aten::format": _format,
    "aten::warn": _warn,
    "prim::Print": _print,
    "aten::__range_length": _range_length,
    "aten::__derive_index": _derive_index,
    "aten::dict": dict,
    "aten::size": lambda t: list(t.shape),
    "aten::size.int": lambda t, dim: t.shape[dim],
    "aten::dim": lambda t: t.dim(),
    "aten::numel": lambda t: t.numel(),
    "aten::Int.Tensor": _from_tensor(int),
    "aten::Float.Tensor": _from_tensor(float),
    "aten::Bool.Tensor": _from_tensor(bool),
    "aten::Int.float": int,
    "aten::Float.int": float,
    "aten::item": lambda t: t.item(),
    "aten::add.int": operator.add,
    "aten::add.float": operator.add,
    "aten::sub.int": operator.sub,
    "aten::sub.float": operator.sub,
    "aten::mul.int": operator.mul,
    "aten::mul.float": operator.mul,
    "aten::div.int": operator.truediv,
    "aten::div.float": operator.truediv,
    "aten::floordiv.int": _int_floordiv,
    "aten::neg.int": operator.neg,
    "aten::eq.int": _same_int,
    "aten::ne.int": lambda a, b: not _same_int(a, b),
    "aten::lt.int": operator.lt,
    "aten::le.int": operator.le,
    "aten::gt.int": operator.gt,
    "aten::ge.int": operator.ge,
    "aten::eq.float": operator.eq,
    "aten::lt.float": operator.lt,
    "aten::gt.float": operator.gt,
    "aten::eq.str": operator.eq,
    "aten::ne.str": operator.ne,
    "aten::sqrt.float": math.sqrt,
    "aten::sqrt.int": math.sqrt,
}

# Dict ops come in one overload per key type; they all mean the same thing to Python.
for _key in ("str", "int", "bool", "float", "Tensor", "complex"):
    HOST_OPS[f"aten::__getitem__.Dict_{_key}"] = operator.getitem
    HOST_OPS[f"aten::_set_item.{_key}"] = _set_item
    HOST_OPS[f"aten::len.Dict_{_key}"] = len
    HOST_OPS[f"aten::keys.{_key}"] = lambda d: list(d.keys())
    HOST_OPS[f"aten::values.{_key}"] = lambda d: list(d.values())
    HOST_OPS[f"aten::items.{_key}"] = lambda d: list(d.items())
    HOST_OPS[f"aten::__contains__.{_key}"] = lambda d, k: k in d
    HOST_OPS[f"aten::get.{_key}"] = _dict_get
    HOST_OPS[f"aten::get.default_{_key}"] = _dict_get
    HOST_OPS[f"aten::Delete.Dict_{_key}"] = operator.delitem
    HOST_OPS[f"aten::clear.{_key}"] = _clear
    HOST_OPS[f"aten::copy.Dict_{_key}"] = dict
    HOST_OPS[f"aten::dict.Dict_{_key}"] = dict
    HOST_OPS[f"aten::dict.{_key}"] = dict  # from (key, value) pairs: OrderedDict(zip(names, results))
    HOST_OPS[f"aten::pop.Dict_{_key}"] = lambda d, k: d.pop(k)
    HOST_OPS[f"aten::pop.Dict_default_{_key}"] = lambda d, k, default: d.pop(k, default)
    HOST_OPS[f"aten::popitem.{_key}"] = lambda d: tuple(d.popitem())
    HOST_OPS[f"aten::setdefault.{_key}"] = lambda d, k, default: d.setdefault(k, default)
    HOST_OPS[f"aten::update.{_key}"] = lambda d, other: d.update(other)

# The other ops of TorchScript's generic schemas (`t[]`, `t`): torch.ops cannot bind a type variable from a Python
# value ("toIValue() cannot handle converting to type: t"), so the runtime runs them as Python does.
HOST_OPS.update({
    "aten::str": print_text,
    "aten::Delete.t": operator.delitem,
    "aten::_unwrap_optional": _unwrap_optional,
    "aten::add_.t": _extend_in_place,
    "aten::mul.left_t": operator.mul,
    "aten::mul.right_": operator.mul,
    "aten::mul_.t": _repeat_in_place,
    "aten::reverse.t": lambda items: items.reverse(),
    "aten::select.t": operator.getitem,
    "aten::sort.any": _sort_in_place,
    "aten::sorted.any": sorted,
})
# List ops that write their list in place: through torch.ops they would sort or shrink a copy of it.
for _item in ("int", "float", "bool", "str", "Tensor"):
    HOST_OPS[f"aten::sort.{_item}"] = _sort_in_place
    HOST_OPS[f"aten::remove.{_item}"] = lambda items, x: items.remove(x)
