"""The repository model: facts that hold across the files of a program, not one file (model.py).

Beside the per-file program model (`program/`), below the rules: the pipeline builds it once per run
(`pipeline/repository_facts.py`) and each file's rules read what it says about that file from
`Settings.outside`, as `analysis.outside` (plain data: the launch modes of the programs that run the file, and
the training-step calls of defs it imports). Nothing here imports from `program/` or the rules.
"""
