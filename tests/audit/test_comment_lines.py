"""NM901 asks which suppression lines hold a real comment: tokenizing only those lines must say what tokenizing the
whole text says, on every shape where a `#` can sit inside a string or a comment can sit between strings."""
from __future__ import annotations

from pathlib import Path

import pytest

from neuron_migrate.names.analysis import Analysis
from neuron_migrate.rules.builtin.meta import _comment_lines, comment_lines_among

ROOT = Path(__file__).resolve().parents[2]

SHAPES = [
    'x = 1  # noqa: NM101\ny = "# noqa: NM101"\n',
    'doc = """\n# noqa: NM101\n"""  # noqa: NM102\nz = 2  # noqa\n',
    'msg = ("first part "  # noqa: NM101\n       "# second part")  # noqa: NM102\n',
    "s = 'a\\\n# noqa: NM101'\nt = 1  # noqa: NM103\n",
    'f = f"""{\n1}  # noqa: NM101\n"""  # noqa: NM102\n',
    'x = """  # noqa: NM101\n"""\n',
    'def f():\n    """Doc.\n\n    # noqa: NM101\n    """\n    return 1  # noqa: NM102\n',
    'if a:\n    pass\nelse:  # noqa: NM101\n    b = (1,\n         2)  # noqa: NM102\n',
    'value = 1 + \\\n    2  # noqa: NM101\n',
    "b = b'#x'  # noqa: NM101\nc = '#' + '#'\n",
]


def _sources() -> list[str]:
    files = sorted((ROOT / "neuron_migrate").rglob("*.py"))[:80] + sorted((ROOT / "tests" / "fixtures").rglob("*.py"))[:200]
    return SHAPES + [p.read_text(encoding="utf-8") for p in files]


TEXTS = _sources()


@pytest.mark.parametrize("index", range(len(TEXTS)))
def test_comment_lines_of_some_lines_agree_with_the_whole_text(index):
    text = TEXTS[index]
    a = Analysis(text)
    whole = _comment_lines(text)
    hashes = [i for i, ln in enumerate(text.splitlines(), 1) if "#" in ln]
    assert comment_lines_among(a, hashes) == whole & set(hashes)
    for line in hashes:  # one line at a time: the per-line path is taken whenever no string crosses it
        assert comment_lines_among(a, [line]) == whole & {line}, line
