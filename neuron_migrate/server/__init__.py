"""`neuron-migrate server`: a Language Server (LSP over stdio, built on pygls).

`core.py` is the editor-independent part (check a buffer, compute quick fixes, fix all, noqa) and imports no
LSP library; `lsp.py` maps it onto the protocol. pygls is imported only when the server starts.
"""
