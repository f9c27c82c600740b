"""Objects of TorchScript classes that a model creates as it runs (torchvision's `ImageList`, `LevelMapper`) become
dicts of their attributes: `prim::CreateObject` a `prim::DictConstruct` of type Dict[str, Any], an attribute
write `aten::_set_item`, a read `aten::__getitem__` cast back to the attribute's type.

Both runtimes already run dicts (and keep them by reference, as objects are), so a package needs no notion of a
class, and an object a model caches in its own state (torchvision's `MultiScaleRoIAlign.map_levels`) is state like
any other value. Modules and C++ custom classes (`torch.classes.*`, quantized packed parameters) are not touched:
only classes whose objects the graph itself creates.
"""
from __future__ import annotations

import torch


def objects_as_dicts(graph: torch._C.Graph) -> None:
    created = {node.output().type().qualified_name() for node in graph.findAllNodes("prim::CreateObject", True)}
    if not created:
        return
    as_dict = torch._C.DictType(torch._C.StringType.get(), torch._C.AnyType.get())
    for value in _all_values(graph):
        retyped = _retyped(value.type(), created, as_dict)
        if retyped is not None:
            value.setType(retyped)
    for node in list(graph.findAllNodes("prim::CreateObject", True)):
        made = _create_before(graph, node, "prim::DictConstruct", [])
        made.output().setType(as_dict)
        node.output().replaceAllUsesWith(made.output())
        node.destroy()
    for node in list(graph.findAllNodes("prim::SetAttr", True)):
        if node.inputsAt(0).type() == as_dict:
            key = _constant_before(graph, node, node.s("name"))
            _create_before(graph, node, "aten::_set_item", [node.inputsAt(0), key, node.inputsAt(1)], outputs=0)
            node.destroy()
    for node in list(graph.findAllNodes("prim::GetAttr", True)):
        if node.input().type() == as_dict:
            key = _constant_before(graph, node, node.s("name"))
            read = _create_before(graph, node, "aten::__getitem__", [node.input(), key])
            read.output().setType(torch._C.AnyType.get())
            cast = _create_before(graph, node, "prim::unchecked_cast", [read.output()])
            cast.output().setType(node.output().type())
            node.output().replaceAllUsesWith(cast.output())
            node.destroy()


def _retyped(t, created: set[str], as_dict):
    if isinstance(t, torch._C.ClassType) and t.qualified_name() in created:
        return as_dict
    if isinstance(t, torch._C.OptionalType):
        inner = _retyped(t.getElementType(), created, as_dict)
        return torch._C.OptionalType(inner) if inner is not None else None
    return None


def _all_values(graph: torch._C.Graph):
    yield from graph.inputs()
    for node in _nodes(graph.block()):
        yield from node.outputs()
        for block in node.blocks():
            yield from block.inputs()


def _nodes(block):
    for node in block.nodes():
        yield node
        for inner in node.blocks():
            yield from _nodes(inner)


def _create_before(graph: torch._C.Graph, node, kind: str, inputs: list, outputs: int = 1):
    made = graph.create(kind, inputs, outputs)
    made.insertBefore(node)
    made.copyMetadata(node)
    return made


def _constant_before(graph: torch._C.Graph, node, text: str):
    with graph.insert_point_guard(node):
        return graph.insertConstant(text)
