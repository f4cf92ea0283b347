"""Progress output (pytorch-cifar draws a terminal bar; one line per 4 steps is enough here)."""
import sys


def progress_bar(current, total, msg=None):
    if current % 4 == 3 or current + 1 == total:
        sys.stdout.write(' [%d/%d] %s\n' % (current + 1, total, msg or ''))
