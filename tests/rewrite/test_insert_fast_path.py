"""insert_support's shortcut (every import already among the leading imports) gives what the full placement
gives."""
import pytest

from neuron_migrate.rewrite import insert
from neuron_migrate.rules.model import ImportReq

CASES = [
    ('"""Doc."""\nimport os\nimport torch\n\nx = torch.zeros(1)\n', [ImportReq("torch")]),
    ("import torch\n", [ImportReq("torch")]),
    ("from __future__ import annotations\nimport torch.nn as nn\nimport torch\ny = torch.ones(1)\n", [ImportReq("torch")]),
    # bound only further down: the header gets its own import
    ("x = 1\nimport torch\ny = torch.ones(1)\n", [ImportReq("torch")]),
    ("import os\nprint(os.sep)\nimport torch\ny = torch.ones(1)\n", [ImportReq("torch")]),
    # an alias is another spelling
    ("import torch as t\ny = torch.ones(1)\n", [ImportReq("torch")]),
    ("import numpy as np\ny = np.zeros(1)\n", [ImportReq("numpy", "np")]),
    ("import numpy\ny = np.zeros(1)\n", [ImportReq("numpy", "np")]),
    ("import os\ny = torch.ones(1) + np.zeros(1)\n", [ImportReq("torch"), ImportReq("numpy", "np")]),
    ("import torch\ny = torch.ones(1)\nz = dist.get_rank()\n", [ImportReq("torch"), ImportReq("torch.distributed", "dist")]),
]


@pytest.mark.parametrize("text,reqs", CASES)
def test_shortcut_agrees_with_full_placement(text, reqs, monkeypatch):
    fast = insert.insert_support(text, reqs, [])
    monkeypatch.setattr(insert, "bound_up_front", lambda body, req: None)
    assert insert.insert_support(text, reqs, []) == fast


def test_shortcut_is_taken_only_for_imports_up_front():
    import ast

    body = ast.parse('"""Doc."""\nimport os\nimport torch\nx = 1\nimport numpy as np\n').body
    assert insert.bound_up_front(body, ImportReq("torch"))
    assert not insert.bound_up_front(body, ImportReq("numpy", "np"))
    assert not insert.bound_up_front(body, ImportReq("torch.distributed", "dist"))
