"""The whole-program model: facts about a file that no single call site shows.

Sits between name resolution (`names/`) and the rules: launch mode (entry point or library), whether a process
group exists (and is guaranteed) at a point, whether an optimizer's model is always DDP-wrapped, which values
reach the device, which string values flow into which comparisons. Rules ask it instead of guessing from one site.
"""
