# poor man's configurator: python train.py --max_iters=20 --compile=False
import sys
from ast import literal_eval

for arg in sys.argv[1:]:
    assert arg.startswith("--"), arg
    key, val = arg[2:].split("=")
    assert key in globals(), f"unknown config key {key}"
    try:
        attempt = literal_eval(val)
    except (SyntaxError, ValueError):
        attempt = val
    globals()[key] = attempt
