"""decode_source decides the encoding as tokenize.detect_encoding does (BOM, a PEP 263 cookie on the first two
lines, else UTF-8) without importing tokenize when no cookie can be there; errors are tokenize's."""
from __future__ import annotations

import codecs
import io
import tokenize

import pytest

from neuron_migrate.files.source import SourceError, decode_source

CASES = [
    b"x = 1\n", b"\xef\xbb\xbfx = 1\n", b"# -*- coding: latin-1 -*-\nx = '\xe9'\n",
    b"#!/usr/bin/env python\n# coding=cp1252\ns = '\x80'\n", b"x = '\xe9'\n", b"\n\n# coding: latin-1\nx = '\xe9'\n",
    b"\xef\xbb\xbf# coding: latin-1\n", b"# coding: nonsense\n", b"a\rb\r# coding: latin-1\r", b"",
    b"x = '\xc3\xa9'  # no cookie\n", b"y = 1\nx = '\xe9'\n", b"\xef\xbb\xbf\xff\n", b"# vim: set fileencoding=utf-8 :\nx = 1\n",
    b"# coding: ascii\nx = '\xc3\xa9'\n", b"x = 1  # decoding happens later\n",
]


def _tokenize_says(raw: bytes):
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
    except SyntaxError:
        return "bad declaration"
    bom = raw.startswith(codecs.BOM_UTF8)
    encoding = "utf-8" if encoding == "utf-8-sig" else encoding
    try:
        return (raw[3:] if bom else raw).decode(encoding), encoding, bom
    except (UnicodeDecodeError, LookupError):
        return "cannot decode"


@pytest.mark.parametrize("raw", CASES)
def test_decodes_as_tokenize_does(raw):
    try:
        got = decode_source(raw)
    except SourceError as exc:
        got = "bad declaration" if "declaration" in str(exc) else "cannot decode" if "cannot decode" in str(exc) else str(exc)
    assert got == _tokenize_says(raw)
