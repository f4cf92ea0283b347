"""The whole-program value sets (program/values.py) and device flow (program/device_flow.py)."""
from __future__ import annotations

import ast
import textwrap

from neuron_migrate.names.analysis import Analysis
from neuron_migrate.program import device_flow, values


def _analysis(src: str) -> Analysis:
    return Analysis("import argparse\nimport os\nimport torch\nimport torch_xla.core.xla_model as xm\n" + textwrap.dedent(src))


def _strings(a: Analysis, value: str) -> list[ast.Constant]:
    found = [n for n in ast.walk(a.tree) if isinstance(n, ast.Constant) and n.value == value]
    return sorted(found, key=lambda n: (n.lineno, n.col_offset))


def _set(a, node):
    vs = values.facts(a).set_of(node)
    assert vs is not None
    return vs


# -- value sets ------------------------------------------------------------------------------------
def test_dataclass_field_and_comparison_are_one_label_value():
    a = _analysis("""
        from dataclasses import dataclass

        @dataclass
        class Cfg:
            device: str = "xla"

        def resolve(requested):
            if requested == "xla":
                return xm.xla_device()
            return torch.device("cpu")

        def main():
            return resolve(Cfg().device)

        if __name__ == "__main__":
            main()
    """)
    field, compare = _strings(a, "xla")
    vs = _set(a, field)
    assert vs is _set(a, compare)
    assert [m.role for m in vs.members] == ["field", "compare"]
    assert not vs.sink and vs.external and vs.plan() == "keep"


def test_value_reaching_torch_device_must_change_whole():
    a = _analysis("""
        def main():
            p = argparse.ArgumentParser()
            p.add_argument("--device", default="xla", choices=["cpu", "xla"])
            args = p.parse_args()
            if args.device == "xla":
                print("accelerated")
            return torch.device(args.device)
    """)
    members = _strings(a, "xla")
    assert len(members) == 3
    vs = _set(a, members[0])
    assert all(_set(a, m) is vs for m in members)
    assert vs.sink and vs.plan() == "all"
    assert {m.role for m in vs.members} == {"cli-default", "choice", "compare"}
    assert any("command line (--device)" in r for r in vs.external)


def test_parameter_default_joins_callers_and_sink():
    a = _analysis("""
        def make(n, device="xla"):
            return torch.zeros(n, device=device)

        def main():
            make(2, device="xla")
            make(3, "cpu")
    """)
    default, call_kw = _strings(a, "xla")
    vs = _set(a, default)
    assert vs is _set(a, call_kw) and vs is _set(a, _strings(a, "cpu")[0])
    assert vs.sink and vs.plan() == "all"


def test_unrelated_label_is_its_own_set_and_free():
    a = _analysis("""
        def main():
            mode = "xla"
            if mode == "xla":
                print(mode)
        if __name__ == "__main__":
            main()
    """)
    vs = _set(a, _strings(a, "xla")[0])
    assert not vs.sink and not vs.external and vs.plan() == "free"


def test_dict_table_keys_and_lookup():
    a = _analysis("""
        FACTORIES = {"xla": xm.xla_device, "cpu": lambda: torch.device("cpu")}

        def pick(name):
            return FACTORIES[name]()

        def main():
            pick("xla")
    """)
    key, arg = _strings(a, "xla")
    assert _set(a, key) is _set(a, arg)
    assert [m.role for m in _set(a, key).members if m.kind == "xla"] == ["dict-key", "argument"]


def test_multi_backend_comparisons():
    a = _analysis("""
        def sync(device):
            if device.type == "cuda":
                torch.cuda.synchronize()
            elif device.type in ("xpu", "gpu"):
                pass
    """)
    vs = _set(a, _strings(a, "cuda")[0])
    assert vs.multi_backend and vs.sink and {"cuda", "xpu", "gpu"} <= vs.kinds
    b = _analysis("""
        def pick(name):
            return "cuda" if name in ("cuda", "gpu") else "cpu"
    """)
    assert not _set(b, _strings(b, "gpu")[0]).multi_backend  # 'gpu' is CUDA's other name


# -- device flow -----------------------------------------------------------------------------------
def _calls(a, method: str) -> list[ast.Call]:
    found = [n for n in ast.walk(a.tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == method]
    return sorted(found, key=lambda n: (n.lineno, n.col_offset))


def test_placement_and_fate():
    a = _analysis("""
        def f(x, device):
            ref = x.detach().cpu().double()
            y = x.to(device)
            z = y.double()
            w = torch.ones(3).double().to(device)
            host = torch.zeros(2, device="cpu").double()
            u = x.double()
            return ref, z, w, host, u
    """)
    flow = device_flow.facts(a)
    ref, z, w, host, u = _calls(a, "double")
    assert flow.placement(ref.func.value) == "cpu" and flow.fate(ref) == "cpu"
    assert flow.placement(z.func.value) == "device"
    assert flow.fate(w) == "device"
    assert flow.placement(host.func.value) == "cpu"
    assert flow.placement(u.func.value) == "unknown" and flow.fate(u, fallback=False) == "unknown"
    assert flow.touches_device


def test_device_value_and_device_variable():
    a = _analysis("""
        def main(args):
            if args.device is not None:
                device = torch.device(args.device)
            else:
                device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            model = Net().cuda()
            return model

        def host_only(cpu_device="cpu"):
            return torch.ones(1).cuda()
    """)
    flow = device_flow.facts(a)
    first, second = _calls(a, "cuda")
    assert flow.device_name_at(first) == "device"
    assert flow.device_name_at(second) is None  # a CPU default is not the program's device
    assert flow.is_device_value(ast.parse('"neuron:0"', mode="eval").body) is True
    assert flow.is_device_value(ast.parse('"cpu"', mode="eval").body) is False


def test_dispatch_functions():
    a = _analysis("""
        def best():
            if torch.cuda.is_available():
                return torch.device("cuda")
            if torch.backends.mps.is_available():
                return torch.device("mps")
            return torch.device("cpu")

        def cuda_only():
            if torch.cuda.is_available():
                return torch.device("cuda")
            return torch.device("cpu")
    """)
    flow = device_flow.facts(a)
    cuda_strings = _strings(a, "cuda")
    assert flow.is_dispatch(cuda_strings[0]) and flow.dispatch_backends(cuda_strings[0]) == {"cuda", "mps"}
    assert not flow.is_dispatch(cuda_strings[1])  # two backends: only the function that tests both dispatches
    b = _analysis("""
        def cuda_only():
            if torch.cuda.is_available():
                return torch.device("cuda")

        def accelerate_style():
            if is_torch_xla_available():
                return "xla"
            elif is_npu_available():
                return "npu"
            return "cpu"
    """)
    flow = device_flow.facts(b)
    assert flow.is_dispatch(_strings(b, "npu")[0])
    assert flow.is_dispatch(_strings(b, "cuda")[0])  # three backends in the file: a multi-backend library


def test_name_defined_through_itself_does_not_recurse():
    # lightning's bitsandbytes plugin: `device = device or torch.device("cuda")` then `device = torch.device(device)`;
    # resolving `device` once looped until RecursionError, and the whole file was reported as "nesting too deep"
    a = _analysis("""
        def quantize(weight, device=None):
            device = device or torch.device("cuda")
            device = torch.device(device)
            if device.type != "cuda":
                raise RuntimeError(device.type)
            return weight.to(device)

        def to_empty(weight, device):
            device = torch.device(device)
            return torch.empty_like(weight, device=device)
    """)
    flow = device_flow.facts(a)
    fn = next(n for n in ast.walk(a.tree) if isinstance(n, ast.FunctionDef) and n.name == "quantize")
    ret = fn.body[-1].value
    assert flow.is_device_value(ret.args[0], fn) is True  # `device or torch.device("cuda")` still counts
    fn2 = next(n for n in ast.walk(a.tree) if isinstance(n, ast.FunctionDef) and n.name == "to_empty")
    assert flow.is_device_value(fn2.body[-1].value.keywords[0].value, fn2) in (None, True)


def test_a_nodes_owner_is_its_def_when_it_is_a_statement_of_the_body():
    from neuron_migrate.program.values import _owner

    a = Analysis("@dec(1)\ndef f(x=g()) -> h:\n    y = 1\n    class C:\n        z = 2\n    def inner():\n        return 3\n"
                 "    return y\n")

    def scanned(node):
        child, up = node, a.parent_of.get(node)
        while up is not None:
            if isinstance(up, ast.ClassDef):
                return None
            if isinstance(up, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return up if any(stmt is child for stmt in up.body) else None
            child, up = up, a.parent_of.get(up)
        return None

    nodes = [n for n in ast.walk(a.tree) if n in a.parent_of]
    assert len(nodes) > 15
    assert all(_owner(n, a.parent_of) is scanned(n) for n in nodes)
    assert any(_owner(n, a.parent_of) is None for n in nodes) and any(_owner(n, a.parent_of) is not None for n in nodes)
