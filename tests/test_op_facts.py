"""One description of each op: every fact a pass or a runtime asks about an op is a field of the op table's OpInfo
(transpiler/op_table.py), and the runtimes read the facts they need from files generated out of it."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OP_NAME = re.compile(r"^(aten|prim|quantized|mkldnn|torchvision|onednn)::\w")
SCANNED = ["transpiler", "emitters", "deploy", "loaders", "jit2triton"]
GENERATED = {"transpiler/op_table.py", "deploy/op_facts.py"}
# Collections of op names that are not facts about ops, each with why: what a pass builds, or runs, by name
NOT_FACTS = {
    ("transpiler/decompose_mha.py", "_SCHEMAS"): "the schemas of the nodes it builds",
    ("transpiler/lower_pointwise.py", "bounds"): "how many of the lowering's own arguments are bounds, per overload",
    ("transpiler/onednn_conv.py", "OP"): "the names of the two ops it builds",
    ("transpiler/onednn_conv.py", "ACTIVATIONS"): "op -> the oneDNN attribute naming it in the op it builds",
    ("transpiler/onednn_linear.py", "EPILOGUES"): "op -> the oneDNN attribute naming it in the op it builds",
    ("deploy/host_ops.py", "HOST_OPS"): "the reference interpreter's implementation of each host op",
    ("deploy/host_ops.py", "<module>"): "the reference interpreter's implementation of each host op",
    ("loaders/side_effects.py", "REFUSED"): "the message each refused op gets; the loader runs before the op table "
                                            "(a test below keeps its ops among the table's forbidden ones)",
    ("loaders/side_effects.py", "drop_grad_modes"): "the two TorchScript node kinds of a `with` block it removes",
    ("loaders/side_effects.py", "UNSUPPORTED"): "the message each op no runtime runs gets; the loader runs before the "
                                                "op table",
    ("loaders/torchscript.py", "_REMOTE_FUTURES"): "the ops whose futures no fork made, which the fork/wait "
                                                   "inlining leaves for the refusal",
    ("loaders/torchscript.py", "CALLS"): "the two TorchScript call nodes its inliner inlines, read before our IR "
                                         "and its op table exist",
    **{("loaders/mkldnn_form.py", name): "torch.jit.optimize_for_inference's MKL-DNN ops and the dense ATen op each "
                                         "is written back as, before our IR and its op table exist"
       for name in ("SAME_INPUTS", "BOUNDED", "dense_form", "_KINDS")},
    # The freezing decision reads TorchScript's graph before freezing, so before our IR and its op table exist
    ("loaders/torchscript.py", "_FOLDED"): "the ops torch.jit.freeze's numerics-changing passes fold",
    **{("loaders/discrete_outputs.py", name): "which TorchScript ops decide discretely, read before freezing (the "
                                              "loader runs before the op table)"
       for name in ("CHOOSING", "CHOOSING_BY_INDICES", "COMPARISONS", "MASK_DECIDES", "MASK_KEEPS", "SIZE_ONLY")},
}


def _op_names(node: ast.AST) -> int:
    """How many op names a collection literal (or a `"...".split()`) lists directly."""
    if isinstance(node, (ast.Set, ast.Tuple, ast.List)):
        items = node.elts
    elif isinstance(node, ast.Dict):
        items = [k for k in node.keys if k is not None]
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "split"
          and isinstance(node.func.value, ast.Constant) and isinstance(node.func.value.value, str)):
        return sum(bool(OP_NAME.match(word)) for word in node.func.value.value.split())
    else:
        return 0
    return sum(isinstance(i, ast.Constant) and isinstance(i.value, str) and bool(OP_NAME.match(i.value)) for i in items)


def _where(parents: list[ast.AST]) -> str:
    """The name a collection belongs to: the variable it is assigned to, else the function it is in."""
    for node in reversed(parents):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], (ast.Name, ast.Tuple)):
            target = node.targets[0]
            return target.id if isinstance(target, ast.Name) else getattr(target.elts[0], "id", "<module>")
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            return node.target.id
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            return node.name
    return "<module>"


def _op_sets(path: Path) -> list[tuple[str, int]]:
    found = []

    def visit(node: ast.AST, parents: list[ast.AST]) -> None:
        if _op_names(node) >= 2:
            found.append((_where(parents), node.lineno))
        for child in ast.iter_child_nodes(node):
            visit(child, parents + [node])

    visit(ast.parse(path.read_text()), [])
    return found


def test_no_pass_keeps_its_own_op_set() -> None:
    """A set of op names in a pass is a fact the op table does not hold: adding an op would mean finding every such
    set. Declare the fact in transpiler/op_table.py (`register` or `facts`) and ask `lookup(op)`; a runtime reads
    deploy/op_facts.py or op_facts.h."""
    wrong, exempted = [], set()
    for stage in SCANNED:
        for path in sorted((ROOT / stage).rglob("*.py")):  # (deploy/packaging/ and deploy/serving/ too)
            relative = path.relative_to(ROOT).as_posix()
            if relative in GENERATED:
                continue
            for name, line in _op_sets(path):
                if (relative, name) in NOT_FACTS:
                    exempted.add((relative, name))
                else:
                    wrong.append(f"{relative}:{line} ({name})")
    assert not wrong, "op sets outside the op table: " + ", ".join(wrong)
    assert exempted == set(NOT_FACTS), f"exemptions that no longer match anything: {set(NOT_FACTS) - exempted}"


def test_the_scan_finds_an_op_set(tmp_path: Path) -> None:
    path = tmp_path / "a_pass.py"
    path.write_text('READS = frozenset({"aten::size", "aten::dim"})\nWORDS = "aten::cat aten::stack".split()\n'
                    'def f(op):\n    return op in ("prim::If", "prim::Loop") or op == "aten::add.Tensor"\n')
    assert [name for name, _ in _op_sets(path)] == ["READS", "WORDS", "f"]


def test_the_runtimes_op_facts_are_generated_from_the_op_table() -> None:
    """The runtimes may not import the transpiler, so deploy/op_facts.py and deploy/cpp/src/op_facts.h hold what they
    need of the table; a fact changed in the table without regenerating them shows here."""
    from jit2triton.transpiler import export_facts
    fix = "run `python -m jit2triton.transpiler.export_facts`"
    assert export_facts.PYTHON_FILE.read_text() == export_facts.python_module(), f"deploy/op_facts.py is stale: {fix}"
    assert export_facts.CPP_FILE.read_text() == export_facts.cpp_header(), f"op_facts.h is stale: {fix}"


def test_the_loader_refuses_only_ops_the_table_forbids() -> None:
    from jit2triton.loaders.side_effects import REFUSED
    from jit2triton.transpiler.op_table import lookup
    assert all(lookup(op).forbidden for op in REFUSED)


def test_facts_declared_apart_from_the_category_reach_the_entry_and_survive_lowering() -> None:
    from jit2triton.transpiler.lowering import load_lowerings
    from jit2triton.transpiler.op_table import OP_TABLE, lookup
    load_lowerings()
    assert OP_TABLE["aten::slice.Tensor"].lowering is not None
    assert lookup("aten::slice.Tensor").scatter_form == "aten::slice_scatter"  # declared by `facts`, after `register`
    assert lookup("aten::nonzero").discontinuous  # every data-dependent size is
    assert lookup("aten::rand_like").impure and lookup("prim::ListConstruct").category == "host"
    assert lookup("aten::item").category == "host" and lookup("aten::Int.Tensor").syncs_host
