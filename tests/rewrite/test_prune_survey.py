"""The import pruning's survey of a rewritten text (its name loads, strings and imports outside `try:`) is read off
the last round's analysis instead of a walk of its tree: it must say exactly what the walk says, or an import still
in use is removed (the program then fails with NameError) or one left unused stays."""
from __future__ import annotations

import ast
import sys
import textwrap

import pytest

from neuron_migrate.names.analysis import Analysis
from neuron_migrate.rewrite.engine import fix_text
from neuron_migrate.rewrite.prune import _survey, survey_of_analysis, unused_import_fixes
from neuron_migrate.rules.registry import RuleSet, all_rules

# every place a name can stand that the name analysis walks in its own way: decorators, defaults and annotations
# of defs and lambdas (evaluated outside the function), resolved call chains, keyword values, comprehensions,
# f-strings, match patterns, class bodies, `del`, and imports under try/except (availability probes) at any depth
SCRIPT = textwrap.dedent('''\
    """Module docstring naming np."""
    import os
    import numpy as np
    from typing import Optional
    try:
        import torch_xla.core.xla_model as xm
    except ImportError:
        xm = None
    import torch


    def cached(fn):
        return fn


    @cached
    def build(size: np.ndarray = np.zeros(3), *, scale: Optional[float] = None) -> torch.Tensor:
        import json
        try:
            from fancy import thing
        except ImportError:
            thing = None
        values = [json.dumps(v) for v in range(size) if v]
        pick = lambda k=os.sep: k * 2
        label = f"{os.name}:{values!r}"
        del values
        match label:
            case str(x) if x:
                return torch.tensor([len(x)], dtype=torch.float32)
            case _:
                import math
                return torch.zeros(math.floor(1.5), device=xm.xla_device() if xm else "cpu")


    class Config:
        from collections import OrderedDict
        device: str = "xla"
        table = OrderedDict(a=1)
        def method(self, arg=os.getcwd()):
            return (lambda y: y + np.pi)(arg)
    ''')


def _same(a, b) -> None:
    names_a, strings_a, imports_a = a
    names_b, strings_b, imports_b = b
    assert names_a == names_b
    assert sorted(strings_a.split("\n")) == sorted(strings_b.split("\n"))  # searched with \b...\b: order is free
    assert [id(i) for i in imports_a] == [id(i) for i in imports_b]  # same statements, same order (the fixes')


def test_survey_from_the_analysis_equals_the_tree_walk():
    analysis = Analysis(SCRIPT, "script.py")
    walked = _survey(analysis.tree)
    _same(survey_of_analysis(analysis), walked)
    names, _strings, imports = walked
    assert names["np"] == 3 and names["os"] == 3 and names["xm"] == 2  # loads only: not the docstring, not `xm = None`
    assert names["values"] == 2  # the comprehension's result read in the f-string and deleted
    # the probes under try: are not pruning candidates; the others are, in the order of the first version's walk
    # (checked against it: the module's, then the last container's first, the class before the function)
    assert [ast.unparse(i) for i in imports] == ["import os", "import numpy as np", "from typing import Optional",
                                                 "import torch", "from collections import OrderedDict",
                                                 "import json", "import math"]


@pytest.mark.skipif(sys.version_info < (3, 12), reason="type parameters are Python 3.12+ syntax")
def test_names_in_type_parameter_bounds_count_as_uses():
    # the name analysis does not walk a def's type parameters: the survey must, or `np` looks unused here
    text = "import numpy as np\n\n\ndef first[T: np.ndarray](items: list[T]) -> T:\n    return items[0]\n"
    analysis = Analysis(text, "generic.py")
    survey = survey_of_analysis(analysis)
    _same(survey, _survey(analysis.tree))
    assert survey[0]["np"] == 1
    assert unused_import_fixes("import numpy as np\nnp.zeros(1)\n", text, after_survey=survey) == []


def test_rewrite_prunes_only_imports_the_fixes_left_unused():
    # xm goes with the last mark_step; the other imports stay, the one only a string names too
    text = textwrap.dedent('''\
        import os
        import torch
        import torch_xla.core.xla_model as xm
        import numpy as np

        __all__ = ["np"]


        def train(model, batches):
            for batch in batches:
                loss = model(batch).sum()
                loss.backward()
                xm.mark_step()
            return os.getpid(), torch.zeros(1)
        ''')
    out = fix_text(text, "train.py", RuleSet(all_rules())).text
    assert "import torch_xla.core.xla_model as xm" not in out
    assert "xm." not in out
    assert "import os\nimport torch\n" in out
    assert "import numpy as np\n" in out  # `__all__` names it
    compile(out, "train.py", "exec")
