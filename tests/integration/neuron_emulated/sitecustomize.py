"""TEST-ONLY: run a migrated program on neuron-migrate's EMULATED `neuron` device. Never ship this.

Put this folder first on PYTHONPATH of a child process (torchrun passes PYTHONPATH on to its workers); Python imports
it at start-up, before the program, which then runs unchanged on a real PrivateUse1 device named `neuron`
(`neuron_migrate.probe.emulator`: host memory, aten ops through the boxed CPU fallback, `torch.accelerator` reports
`neuron`, process-group backend `neuron` on gloo, `torch.compile(backend="neuron")` through aot_autograd, eager).
Unlike the CPU stand-in (`neuron_on_cpu/`), nothing is mapped back to `cpu`: a program that still picks `cpu` or
`cuda` runs there, and a test sees it in the tensors' device type.

Settings (environment):
- `NEURON_EMULATED=0` disables it (the folder may stay on PYTHONPATH).
- Exit: after every other exit handler, the process ends with `os._exit` and the status Python would have used
  (the CPU stand-in's `_install_fast_exit`; `NEURON_ON_CPU_FAST_EXIT=0` turns it off).
- `NEURON_ON_CPU_COLLECTIVES=DIR` counts collectives and records the process group joined, as the CPU stand-in does
  (its `_count_collectives` / `_record_group`): DIR/rank<RANK>-<pid>.json at exit.
"""
from __future__ import annotations

import os


def _install() -> None:
    import functools
    import importlib.util

    # the CPU stand-in's exit and collective counting, loaded under another name (its own install is off)
    os.environ["NEURON_ON_CPU"] = "0"
    spec = importlib.util.spec_from_file_location(
        "_neuron_on_cpu_counting", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "neuron_on_cpu",
                                                "sitecustomize.py"))
    shim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shim)
    # A backward pass on the emulated device starts autograd's device thread, which can abort the process after the
    # program has finished ("terminate called without an active exception" while the interpreter finalizes; seen once
    # in CI on a busy machine). The probe's child exits the same way. Installed before torch is imported, so that the
    # exit handlers torch and the program register (logging's shutdown, multiprocessing's) run before it.
    shim._install_fast_exit()

    import torch  # noqa: F401
    from neuron_migrate.probe import emulator

    from neuron_migrate.table import load_table

    emulator.install(load_table())
    log_dir = os.environ.get("NEURON_ON_CPU_COLLECTIVES")
    if not log_dir:
        return
    import torch.distributed as dist

    shim._count_collectives(dist, log_dir)
    real_init = dist.init_process_group

    @functools.wraps(real_init)
    def init_process_group(*args, **kwargs):
        result = real_init(*args, **kwargs)
        shim._record_group(dist)
        return result

    dist.init_process_group = init_process_group


if os.environ.get("NEURON_EMULATED", "1") != "0":
    _install()
