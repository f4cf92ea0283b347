"""The repository model (neuron_migrate/repository/): imports, entry points and launch modes across the files of a
repository, and what the rewrite of one file does with them.

The layouts are small repositories written here: a package layout (a trainer module with its own `__main__`,
imported by a distributed script through the package), and the `sys.path` layout of pytorch/xla's examples
(`examples/train_resnet_base.py` with its own `__main__`, imported by `examples/data_parallel/train_resnet_ddp.py`
after it appends the parent folder to `sys.path`, and run under `torch_xla.launch`).
"""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from typer.testing import CliRunner

from neuron_migrate.cli.app import app
from neuron_migrate.pipeline.repository_facts import repository_facts, roots_of
from neuron_migrate.repository.model import RepositoryModel, repository_root
from neuron_migrate.repository.scan import _sink_attrs, scan_launcher, scan_packaging, scan_python


def cli(*args, input=None):
    return CliRunner().invoke(app, [*args], input=input, catch_exceptions=False)


def write(root: Path, files: dict) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return root


BASE = """\
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr


    class TrainBase:
        def __init__(self):
            self.device = torch_xla.device()
            self.model = torch.nn.Linear(4, 2).to(self.device)
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
            self.num_steps = 1200 // xr.world_size()
            self.compiled_step_fn = torch_xla.compile(self.step_fn, full_graph=True)

        def step_fn(self, data, target):
            self.optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(self.model(data), target)
            loss.backward()
            self.optimizer.step()
            return loss

        def start_training(self):
            xm.master_print("epoch begin")


    if __name__ == "__main__":
        TrainBase().start_training()
    """

DDP_SYS_PATH = """\
    import os
    import sys
    example_folder = os.path.dirname(os.path.dirname(os.path.abspath(sys.argv[0])))
    sys.path.append(example_folder)
    from train_base import TrainBase

    import torch.distributed as dist
    import torch_xla


    class TrainDDP(TrainBase):
        def __init__(self):
            dist.init_process_group("xla", init_method="xla://")
            super().__init__()


    def _mp_fn(index):
        TrainDDP().start_training()


    if __name__ == "__main__":
        torch_xla.launch(_mp_fn)
    """

SINGLE = """\
    import torch_xla.runtime as xr

    if __name__ == "__main__":
        print(xr.world_size())
    """


@pytest.fixture
def sys_path_repo(tmp_path) -> Path:
    """pytorch/xla's examples layout: a base module with its own __main__, a data-parallel script one folder down that
    appends the parent folder to sys.path and imports the base class, run under torch_xla.launch."""
    return write(tmp_path / "xla", {
        "setup.py": "from setuptools import setup\nsetup(name='x')\n",
        "examples/train_base.py": BASE,
        "examples/data_parallel/train_ddp.py": DDP_SYS_PATH,
        "examples/single.py": SINGLE,
    })


@pytest.fixture
def package_repo(tmp_path) -> Path:
    """A package layout: the trainer module (its own __main__) is imported through the package by a script that runs
    it under xmp.spawn; a config module is imported relatively."""
    return write(tmp_path / "proj", {
        "pyproject.toml": "[project]\nname = 'proj'\n",
        "proj/__init__.py": "",
        "proj/config.py": "BATCH = 8\n",
        "proj/trainer.py": BASE.replace("import torch\n", "import torch\n    from .config import BATCH\n", 1),
        "scripts/train_spawn.py": """\
            import torch_xla.distributed.xla_multiprocessing as xmp
            from proj.trainer import TrainBase


            def _mp_fn(index):
                TrainBase().start_training()


            if __name__ == "__main__":
                xmp.spawn(_mp_fn, args=())
            """,
        "scripts/single.py": SINGLE,
    })


# -- the graph -----------------------------------------------------------------------------------------------------
def test_sys_path_layout_graph_and_modes(sys_path_repo):
    m = RepositoryModel.build(str(sys_path_repo))
    assert m.edges["examples/data_parallel/train_ddp.py"] == ["examples/train_base.py"]
    assert m.program_modes["examples/train_base.py"] == ["single"]
    assert m.program_modes["examples/data_parallel/train_ddp.py"] == ["process group", "torch_xla.launch"]
    assert m.modes_of(str(sys_path_repo / "examples/train_base.py")) == ["process group", "single", "torch_xla.launch"]
    assert m.modes_of(str(sys_path_repo / "examples/single.py")) == ["single"]
    assert sorted(m.programs["examples/train_base.py"]) == ["examples/data_parallel/train_ddp.py", "examples/train_base.py"]


def test_package_layout_graph_and_modes(package_repo):
    m = RepositoryModel.build(str(package_repo))
    # `from proj.trainer import ...` runs the package first; `from .config import` is relative
    assert m.edges["scripts/train_spawn.py"] == ["proj/__init__.py", "proj/trainer.py"]
    assert m.edges["proj/trainer.py"] == ["proj/config.py"]
    assert m.program_modes["scripts/train_spawn.py"] == ["xmp.spawn"]
    for rel in ("proj/trainer.py", "proj/config.py", "proj/__init__.py"):
        assert "xmp.spawn" in m.modes_of(str(package_repo / rel)), rel
    assert m.modes_of(str(package_repo / "scripts/single.py")) == ["single"]


def test_imports_of_every_kind(tmp_path):
    root = write(tmp_path / "r", {
        ".git/HEAD": "",
        "app/__init__.py": "from . import plugins\n",
        "app/plugins/__init__.py": "",
        "app/plugins/extra.py": "X = 1\n",
        "app/sub/deep.py": "from ..plugins import extra\nfrom ...outside import nothing\n",
        "app/loader.py": "import importlib\nmod = importlib.import_module('app.plugins.extra')\n",
        "tools/run.py": "import sys, os\nsys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', 'app'))\nimport plugins.extra as e\n",
        "tools/paths.py": "from pathlib import Path\nimport sys\nsys.path.append(str(Path(__file__).resolve().parents[1] / 'app'))\nfrom plugins import extra\n",
        "src/lib/__init__.py": "",
        "src/lib/core.py": "from lib import helpers\n",
        "src/lib/helpers.py": "",
        "multi.py": "from app.plugins import (\n    extra,\n)\n",
    })
    m = RepositoryModel.build(str(root))
    assert m.edges["app/__init__.py"] == ["app/plugins/__init__.py"]
    assert m.edges["app/sub/deep.py"] == ["app/plugins/__init__.py", "app/plugins/extra.py"]
    assert m.edges["app/loader.py"] == ["app/__init__.py", "app/plugins/__init__.py", "app/plugins/extra.py"]
    assert m.edges["tools/run.py"] == ["app/plugins/__init__.py", "app/plugins/extra.py"]
    assert m.edges["tools/paths.py"] == ["app/plugins/__init__.py", "app/plugins/extra.py"]
    assert m.edges["src/lib/core.py"] == ["src/lib/__init__.py", "src/lib/helpers.py"]
    assert m.edges["multi.py"] == ["app/__init__.py", "app/plugins/__init__.py", "app/plugins/extra.py"]


def test_entry_points_and_launchers(tmp_path):
    root = write(tmp_path / "r", {
        "pyproject.toml": "[project]\nname = 'r'\n\n[project.scripts]\nr-train = \"r.cli:main\"\n",
        "setup.py": "from setuptools import setup\nsetup(entry_points={'console_scripts': ['r-eval = r.evaluate:main']})\n",
        "r/__init__.py": "",
        "r/cli.py": "def main():\n    pass\n",
        "r/evaluate.py": "def main():\n    pass\n",
        "r/plain.py": "from r import shared\n",  # started by the launcher below with torchrun, no __main__ of its own
        "r/shared.py": "",
        "r/mod_entry.py": "",
        "train/job.py": "import r.shared\n",
        "launch.sh": "#!/bin/bash\ntorchrun --nproc_per_node=2 \\\n    r/plain.py --epochs 1\npython -m r.mod_entry\n",
        "jobs/run.slurm": "srun python ${WORK}/train/job.py\n",
    })
    m = RepositoryModel.build(str(root))
    entries = set(m.entries)
    assert {"r/cli.py", "r/evaluate.py", "r/plain.py", "r/mod_entry.py", "train/job.py"} <= entries
    assert m.program_modes["r/plain.py"] == ["torchrun"]
    assert m.program_modes["train/job.py"] == ["single"]
    assert m.program_modes["r/cli.py"] == ["single"]
    assert m.modes_of(str(root / "r/shared.py")) == ["single", "torchrun"]


def test_mp_spawn_and_signals_under_another_main_guard(tmp_path):
    root = write(tmp_path / "r", {
        "setup.py": "",
        "helper.py": """\
            import torch_xla.distributed.xla_multiprocessing as xmp

            def work(i):
                pass

            if __name__ == "__main__":
                xmp.spawn(work)
            """,
        "single.py": "import helper\n\nif __name__ == '__main__':\n    helper.work(0)\n",
        "mp.py": "import torch.multiprocessing as mp\nimport helper\n\nif __name__ == '__main__':\n    mp.spawn(helper.work, nprocs=2)\n",
    })
    m = RepositoryModel.build(str(root))
    # helper's own xmp.spawn runs only when helper is the program: single.py stays single
    assert m.program_modes["single.py"] == ["single"]
    assert m.program_modes["helper.py"] == ["xmp.spawn"]
    assert m.program_modes["mp.py"] == ["mp.spawn"]
    assert m.modes_of(str(root / "helper.py")) == ["mp.spawn", "single", "xmp.spawn"]


def test_scans():
    rec = scan_python(b"import os, sys\nHERE = os.path.dirname(os.path.abspath(__file__))\n"
                      b"ROOT = os.path.dirname(HERE)\nsys.path.insert(0, ROOT)\n"
                      b"sys.path.append(os.path.join(HERE, '..', '..', 'src'))\n"
                      b"from a.b import (c,\n    d as e)\n")
    assert rec["p"] == [[1, ""], [2, "src"]]
    assert rec["i"][-1] == [0, "a.b", [["c", "c"], ["d", "e"]]]
    assert scan_launcher(b"export X=1\npython3 -m torch.distributed.run --nproc_per_node 8 train.py --lr 1\n"
                         b"accelerate launch tools/ft.py\npython eval.py\n") == [
        ["train.py", "torchrun"], ["tools/ft.py", "torchrun"], ["eval.py", "python"]]
    assert scan_packaging("setup.cfg", b"[options.entry_points]\nconsole_scripts =\n    tool = pkg.tool:main\n") == ["pkg.tool"]


def test_roots(tmp_path, sys_path_repo):
    base = sys_path_repo / "examples/train_base.py"
    assert repository_root(str(base)) == str(sys_path_repo)
    loose = write(tmp_path / "loose", {"a/b.py": "", "c.py": ""})
    # no marker above: the folder named on the command line, else the file's own folder
    got = roots_of([str(loose / "a/b.py"), str(loose / "c.py")], [str(loose)])
    assert got == {str(loose): [str(loose / "a/b.py"), str(loose / "c.py")]}
    assert roots_of([str(loose / "a/b.py")]) == {str(loose / "a"): [str(loose / "a/b.py")]}


# -- what the rewrite does with it -----------------------------------------------------------------------------------
def _rewritten(path: Path, *extra) -> str:
    r = cli("rewrite", "--diff", "--unsafe-fixes", "--no-color", *extra, str(path))
    assert r.exit_code in (0, 1), r.output
    return r.output


@pytest.mark.parametrize("layout", ["sys_path_repo", "package_repo"])
@pytest.mark.parametrize("how", ["one file", "whole tree"])
def test_a_module_a_distributed_program_imports_gets_no_single_process_rewrite(layout, how, request, monkeypatch):
    root = request.getfixturevalue(layout)
    monkeypatch.chdir(root)
    base = root / ("examples/train_base.py" if layout == "sys_path_repo" else "proj/trainer.py")
    out = _rewritten(base if how == "one file" else root)
    assert "xr.world_size()" in out  # it was rewritten ...
    assert "1200 // (1)" not in out and "1200 // 1\n" not in out  # ... not to the single-process literal
    # (the world size, read once here: its one-line form rather than a helper, issue 38)
    assert '+        self.num_steps = 1200 // (dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", 1)))' in out
    assert "master_print" in out and '+        print("epoch begin")' not in out  # rank 0 still prints alone
    # the control: a single-device script that no distributed program runs keeps its single-process rewrite
    single = _rewritten(root / ("examples/single.py" if layout == "sys_path_repo" else "scripts/single.py"))
    assert "+    print((1))" in single or "+    print(1)" in single, single


def test_without_the_importer_the_module_is_single_process(sys_path_repo, monkeypatch):
    monkeypatch.chdir(sys_path_repo)
    (sys_path_repo / "examples/data_parallel/train_ddp.py").unlink()
    out = _rewritten(sys_path_repo / "examples/train_base.py")
    assert "_neuron_world_size" not in out and '+        print("epoch begin")' in out, out


def test_cached_results_follow_the_programs_that_import_a_file(sys_path_repo, monkeypatch):
    """The results cache records each file's repository facts: a file cached while it was single-process is
    checked again once a distributed program imports it."""
    monkeypatch.chdir(sys_path_repo)
    ddp = sys_path_repo / "examples/data_parallel/train_ddp.py"
    text = ddp.read_text()
    ddp.unlink()
    base = sys_path_repo / "examples/train_base.py"
    r = cli("audit", "--output-format", "concise", "--exit-zero", str(base))
    assert "single-device program" in r.output
    ddp.write_text(text)
    r = cli("audit", "--output-format", "concise", "--exit-zero", str(base))
    assert "single-device program" not in r.output and "_neuron_world_size()" in r.output, r.output


def test_stdin_reads_the_repository_of_the_named_file(sys_path_repo, monkeypatch):
    monkeypatch.chdir(sys_path_repo)
    base = sys_path_repo / "examples/train_base.py"
    r = cli("rewrite", "-", "--stdin-filename", "examples/train_base.py", "--unsafe-fixes", input=base.read_text())
    assert "1200 // (dist.get_world_size() if dist.is_initialized()" in r.output and "1200 // 1" not in r.output


def test_facts_of_the_run(sys_path_repo):
    facts = repository_facts([str(sys_path_repo / "examples/train_base.py"), str(sys_path_repo / "setup.py")])
    # the DDP script imports TrainBase from it (through sys.path): "imported" names it
    assert facts == {str(sys_path_repo / "examples/train_base.py"): {"modes": ["process group", "single", "torch_xla.launch"],
                                                                     "imported": ["TrainBase"]}}


# -- compiled training steps across classes and files (NM406, NM105) --------------------------------------------------
STEP = """\
    import torch


    class Base:
        def step_fn(self, x):
            self.opt.zero_grad()
            self.loss(x).backward()
            self.opt.step()
    """


def _audit(path: Path) -> str:
    return cli("audit", "--output-format", "concise", "--exit-zero", "--no-cache", str(path)).output


def test_nm406_follows_self_method_through_the_class_and_its_bases(tmp_path):
    root = write(tmp_path / "r", {
        "setup.py": "",
        "same.py": textwrap.dedent(STEP) + textwrap.dedent("""\

            class Trainer(Base):
                def __init__(self):
                    self.c1 = torch.compile(self.step_fn, fullgraph=True)

                def own(self, x):
                    x.backward()

                def build(self):
                    self.c2 = torch.compile(self.own, fullgraph=True)
                    self.c3 = torch.compile(self.forward_only, fullgraph=True)

                def forward_only(self, x):
                    return self.model(x)
            """),
    })
    out = _audit(root / "same.py")
    assert "same.py:12:19: NM406" in out and "of `step_fn`" in out
    assert "same.py:18:19: NM406" in out and "of `own`, which calls backward()" in out
    assert "same.py:19" not in out  # forward only: fullgraph=True is right there


def test_nm406_and_nm105_follow_bases_and_functions_in_other_files(tmp_path):
    root = write(tmp_path / "r", {
        "pyproject.toml": "",
        "pkg/__init__.py": "from .base import Base\n",
        "pkg/base.py": STEP,
        "pkg/steps.py": "def train_step(model, opt, x):\n    opt.zero_grad()\n    model(x).sum().backward()\n    opt.step()\n",
        "pkg/trainer.py": """\
            import torch
            import torch_xla
            from pkg import Base
            from .steps import train_step as step


            class Mid(Base):
                pass


            class Trainer(Mid):
                def __init__(self):
                    self.c1 = torch.compile(self.step_fn, fullgraph=True)
                    self.c2 = torch.compile(step, fullgraph=True)
                    self.c3 = torch_xla.compile(self.step_fn, full_graph=True)
            """,
    })
    out = _audit(root / "pkg/trainer.py")
    assert "trainer.py:13:19: NM406" in out and "of `step_fn`, which calls zero_grad()/backward()/step()" in out
    assert "trainer.py:14:19: NM406" in out and "of `step`" in out
    fixed = _rewritten(root / "pkg/trainer.py")
    assert '+        self.c3 = torch.compile(self.step_fn, backend="neuron")' in fixed, fixed
    assert "+        self.c1 = torch.compile(self.step_fn, fullgraph=False)" in fixed


def test_the_editor_server_reads_the_repository_of_the_buffer(sys_path_repo):
    from neuron_migrate.server.core import Checker

    base = sys_path_repo / "examples/train_base.py"
    checker = Checker()
    findings, error = checker.check(base.read_text(), str(base))
    assert error is None
    messages = [f.message for f in findings if f.rule.code == "NM112"]
    assert messages and not any("single-device program" in m for m in messages), messages
    fixed = checker.fix_all(base.read_text(), str(base), unsafe=True)
    assert "1200 // (dist.get_world_size() if dist.is_initialized()" in fixed
    assert 'RANK", 0))) == 0:\n            print("epoch begin")\n' in fixed  # on rank 0 only, not every process


@pytest.mark.parametrize("case", ["group started in an imported module", "started by torchrun in a launcher"])
def test_an_entry_point_whose_program_is_distributed_elsewhere(tmp_path, case, monkeypatch):
    files = {
        "pyproject.toml": "",
        "train.py": """\
            import torch_xla.runtime as xr
            import setup_utils

            if __name__ == "__main__":
                setup_utils.setup()
                print(xr.world_size())
            """,
        "setup_utils.py": "def setup():\n    pass\n",
    }
    if case.startswith("group"):
        files["setup_utils.py"] = "import torch.distributed as dist\n\n\ndef setup():\n    dist.init_process_group('gloo')\n"
    else:
        files["run.sh"] = "torchrun --nproc_per_node=2 train.py\n"
    root = write(tmp_path / "r", files)
    monkeypatch.chdir(root)
    out = _rewritten(root / "train.py")
    assert "print((1))" not in out and "print(1)" not in out, out
    (root / ("setup_utils.py" if case.startswith("group") else "run.sh")).write_text("def setup():\n    pass\n")
    assert "+    print(1)" in _rewritten(root / "train.py")  # the control: judged alone, it is single-process


def test_a_repository_too_large_to_model_is_never_single_process(sys_path_repo, monkeypatch):
    from neuron_migrate.repository import model

    monkeypatch.setattr(model, "MAX_FILES", 2)
    base = sys_path_repo / "examples/single.py"
    assert repository_facts([str(base)]) == {str(base): {"modes": ["unknown"]}}
    monkeypatch.chdir(sys_path_repo)
    out = _rewritten(base, "--no-cache")
    assert "print(1)" not in out and "dist.get_world_size() if dist.is_initialized()" in out, out


# -- backend and device values across files (issue 36 "What to build" 2, issue 37 point 1) ----------------------------
CONFIG = """\
    import argparse
    from dataclasses import dataclass


    @dataclass
    class TrainConfig:
        backend: str = "nccl"
        device: str = "cuda"
        unused_backend: str = "nccl"


    def parse_args(argv=None):
        parser = argparse.ArgumentParser()
        parser.add_argument(
            "--dist-backend",
            default="nccl", type=str)
        return parser.parse_args(argv)
"""
TRAIN = """\
    import torch
    import torch.distributed as dist

    from trainer.config import TrainConfig, parse_args


    def main():
        args = parse_args()
        cfg = TrainConfig()
        dist.init_process_group(backend=cfg.backend)
        {compare}
        model = torch.nn.Linear(4, 2).to(torch.device(cfg.device))


    if __name__ == "__main__":
        main()
"""


def test_scans_of_backend_and_device_values():
    rec = scan_python(textwrap.dedent(CONFIG).encode())
    assert rec["v"] == {"backend": 7, "device": 8, "unused_backend": 9, "dist_backend": 16}
    train = textwrap.dedent(TRAIN.format(compare="backend = args.dist_backend\n        dist.new_group(backend)")).encode()
    assert _sink_attrs(train) == {"backend": 10, "dist_backend": 12, "device": 13}  # read by the model when asked
    # torch's own attributes, plain names nothing assigns from an attribute, comments
    assert _sink_attrs(b"x = x.to(torch.float32)\ny = torch.zeros(2, device=dev)\n# torch.device(cfg.device)\n") == {}


def _value_repo(tmp_path, compare: str) -> Path:
    return write(tmp_path / "proj", {"pyproject.toml": "", "trainer/__init__.py": "", "trainer/config.py": CONFIG,
                                     "train.py": TRAIN.format(compare=compare)})


@pytest.mark.parametrize("how", ["one file", "whole tree"])
def test_a_config_value_another_file_passes_to_torch_changes_with_it(tmp_path, monkeypatch, how):
    root = _value_repo(tmp_path, 'print(args.dist_backend == "nccl")')
    monkeypatch.chdir(root)
    facts = RepositoryModel.build(str(root)).facts(str(root / "trainer/config.py"))
    assert facts["sinks"] == {"backend": "train.py:10", "device": "train.py:12"}
    out = _rewritten(root / "trainer/config.py" if how == "one file" else root)
    assert '-    backend: str = "nccl"\n-    device: str = "cuda"\n+    backend: str = "neuron"\n+    device: str = "neuron"' in out
    # a field no file passes to torch, and the command-line value only compared: kept, in both files
    assert 'unused_backend: str = "nccl"' in out.replace("-", " ") or "unused_backend" not in out
    assert '"--dist-backend",\n+' not in out and 'default="neuron"' not in out
    assert 'args.dist_backend == "neuron"' not in out


def test_a_command_line_default_follows_its_backend_into_another_file(tmp_path, monkeypatch):
    root = _value_repo(tmp_path, 'dist.new_group(backend=args.dist_backend)\n        print(args.dist_backend == "nccl")')
    monkeypatch.chdir(root)
    out = _rewritten(root)
    assert '-        default="nccl", type=str)\n+        default="neuron", type=str)' in out, out
    assert '-    print(args.dist_backend == "nccl")\n+    print(args.dist_backend == "neuron")' in out, out
    assert "Another file of the program passes it to torch (train.py:11)" in cli(
        "rewrite", "--unsafe-fixes", str(root)).output


def test_a_value_the_scan_cannot_follow_stays_whole_in_both_files(tmp_path, monkeypatch):
    """The backend reaches torch through a call over two lines that the line scan does not read: config.py keeps
    its default, so train.py keeps its comparison too, and says why at the line."""
    root = _value_repo(tmp_path, 'dist.new_group(\n            None, args.dist_backend)\n        print(args.dist_backend == "nccl")')
    monkeypatch.chdir(root)
    out = _rewritten(root)
    assert 'default="neuron"' not in out and 'args.dist_backend == "neuron"' not in out, out
    audit = _audit(root)
    assert ("NM208" in audit and "the default in trainer/config.py:16 is the same value, which that file keeps"
            in audit), audit


def test_a_library_module_links_values_through_its_imports(tmp_path, monkeypatch):
    """No program runs these files: the files a module imports and those importing it carry the value."""
    root = write(tmp_path / "lib", {"setup.py": "", "pkg/__init__.py": "", "pkg/settings.py": CONFIG,
                                    "pkg/dist_utils.py": """\
        import torch.distributed as dist

        from pkg.settings import TrainConfig


        def setup(cfg: TrainConfig):
            dist.init_process_group(backend=cfg.backend)
    """, "other/unrelated.py": """\
        import torch


        def f(opts):
            return torch.device(opts.unused_backend)
    """})
    monkeypatch.chdir(root)
    model = RepositoryModel.build(str(root))
    assert model.facts(str(root / "pkg/settings.py"))["sinks"] == {"backend": "pkg/dist_utils.py:7"}
    out = _rewritten(root / "pkg/settings.py")
    assert '+    backend: str = "neuron"' in out and '+    unused_backend' not in out, out


# -- one RateTracker form per repository (issue 36 point 7) ----------------------------------------------------------
TRACKED = """\
    import torch_xla.core.xla_model as xm


    def train(loader):
        tracker = xm.RateTracker()
        for x in loader:
            tracker.add(x.shape[0])
        print(tracker.rate(), tracker.global_rate())
"""
SMOOTHED = """\
    import torch_xla.core.xla_model as xm


    def evaluate(loader):
        meter = xm.RateTracker(smooth_factor=0.2)
        for x in loader:
            meter.add(len(x))
        return meter.rate()
"""


def test_every_rate_tracker_of_a_repository_gets_one_form(tmp_path, monkeypatch):
    """Under --unsafe-fixes a tracker whose uses one file shows becomes a start time and a count, one with
    smooth_factor= keeps the _RateTracker meter: two files of one repository would get two forms. With both in the
    repository, both get _RateTracker; alone, train.py keeps the plain form."""
    root = write(tmp_path / "proj", {"pyproject.toml": "", "train.py": TRACKED, "evaluate.py": SMOOTHED})
    monkeypatch.chdir(root)
    for path in (root, root / "train.py"):
        out = _rewritten(path)
        assert "SimpleNamespace" not in out and "+    tracker = _RateTracker()" in out, out
    assert "+    meter = _RateTracker(smooth_factor=0.2)" in _rewritten(root)
    assert "Other files of the repository use xm.RateTracker too (evaluate.py)" in cli(
        "rewrite", "--unsafe-fixes", str(root / "train.py")).output
    (root / "evaluate.py").unlink()
    alone = _rewritten(root / "train.py")
    assert "+    tracker = SimpleNamespace(start=time.time(), seen=0)" in alone, alone


def test_config_files_a_configurator_execs_are_values_of_the_program(tmp_path, monkeypatch):
    """nanoGPT: train.py runs `exec(open('configurator.py').read())`, which runs the config files named on the command
    line in train.py's globals. A config file's `backend = 'nccl'` is then train.py's backend: it changes with it."""
    root = write(tmp_path / "gpt", {
        "pyproject.toml": "",
        "configurator.py": """\
            import sys
            for arg in sys.argv[1:]:
                if '=' not in arg:
                    exec(open(arg).read())
                else:
                    key, val = arg[2:].split('=')
                    globals()[key] = val
            """,
        "train.py": """\
            import torch
            import torch.distributed as dist
            backend = 'nccl'
            device = 'cuda'
            steps = 3
            name = 'run'
            exec(open('configurator.py').read())
            late = 'cuda'
            dist.init_process_group(backend=backend)
            x = torch.zeros(2).to(device)
            """,
        "config/train_x.py": "# a run\nimport time\nsteps = 5\ndevice = 'cuda'\nbackend = 'nccl'  # on GPUs\nname = (\n'a' + str(time.time())\n)\n",
        "config/other.py": "steps = 5\nunknown = 'cuda'\n",  # a name train.py does not have: not its config file
        "consts.py": "backend = 'nccl'\n",  # imported: a module, not a config file
        "use.py": "from consts import backend\n",
    })
    assert scan_python(b"steps = 5\ndef f():\n    pass\n").get("cf") is None
    model = RepositoryModel.build(str(root))
    assert model.facts(str(root / "config/train_x.py"))["config_of"] == {
        "program": "train.py", "via": "configurator.py", "sinks": {"device": "train.py:10", "backend": "train.py:9"}}
    assert model.facts(str(root / "train.py"))["exec_config"] == {
        "via": "configurator.py", "names": {"backend": ["config/train_x.py"], "device": ["config/train_x.py"],
                                            "steps": ["config/train_x.py"], "name": ["config/train_x.py"]}}
    assert model.facts(str(root / "config/other.py")) is None and "config_of" not in (model.facts(str(root / "consts.py")) or {})
    monkeypatch.chdir(root)
    out = _rewritten(root)
    assert "-device = 'cuda'\n-backend = 'nccl'  # on GPUs\n+device = 'neuron'\n+backend = 'neuron'  # on GPUs" in out, out
    assert "-backend = 'nccl'\n-device = 'cuda'\n+backend = 'neuron'\n+device = 'neuron'" in out, out
    assert "unknown = 'cuda'" not in out and "consts.py" not in out


def test_nm105_and_nm406_follow_an_override_of_the_compiled_method_in_a_subclass(tmp_path, monkeypatch):
    """The base class compiles `self.step_fn` and its own `step_fn` is forward only; a subclass in another file
    overrides it with the training step. An instance of the subclass compiles the override: fullgraph=True would
    raise at its first call (`Optimizer.zero_grad should not be traced`), so it is left out, with the reason."""
    root = write(tmp_path / "r", {
        "pyproject.toml": "",
        "pkg/__init__.py": "from .base import TrainBase\n",
        "pkg/base.py": """\
            import torch
            import torch_xla


            class TrainBase:
                def __init__(self, model):
                    self.model = model
                    self.compiled_step_fn = torch_xla.compile(self.step_fn, full_graph=True)
                    self.c2 = torch.compile(self.step_fn, fullgraph=True)
                    self.c3 = torch.compile(self.evaluate, fullgraph=True)

                def step_fn(self, data):
                    return self.model(data).sum()

                def evaluate(self, data):
                    return self.model(data)
            """,
        "tasks/classify.py": """\
            from pkg import TrainBase


            class Classify(TrainBase):
                def step_fn(self, data):
                    self.optimizer.zero_grad()
                    loss = super().step_fn(data)
                    loss.backward()
                    self.optimizer.step()
                    return loss
            """,
    })
    model = RepositoryModel.build(str(root))
    assert model.facts(str(root / "pkg/base.py"))["overrides"] == {
        "TrainBase.step_fn": {"c": ["zero_grad", "backward", "step"], "in": "tasks/classify.py"}}
    out = _audit(root / "pkg/base.py")
    assert "base.py:9:19: NM406" in out and "(the override in tasks/classify.py)" in out, out
    assert "base.py:10" not in out  # `evaluate` is overridden nowhere: fullgraph=True is right
    monkeypatch.chdir(root)
    fixed = _rewritten(root / "pkg/base.py")
    assert '+        self.compiled_step_fn = torch.compile(self.step_fn, backend="neuron")\n' in fixed, fixed
    assert '+        self.c2 = torch.compile(self.step_fn, fullgraph=False)' in fixed


def test_a_module_only_xmp_spawn_programs_run_has_a_process_group(tmp_path, monkeypatch):
    """xmp.spawn's rewrite starts the process group before it calls the worker: the functions of a module that only
    such programs run are inside a group, so ranks and rank-0 guards are plain torch.distributed calls."""
    lib = """\
        import torch_xla.core.xla_model as xm
        import torch_xla.runtime as xr


        def shard(n):
            xm.master_print("sharding")
            return n // xr.world_size(), xr.global_ordinal()
        """
    entry = """\
        import torch_xla.distributed.xla_multiprocessing as xmp
        from lib import shard


        def _mp_fn(index):
            print(shard(64))


        if __name__ == "__main__":
            xmp.spawn(_mp_fn)
        """
    root = write(tmp_path / "r", {"pyproject.toml": "", "lib.py": lib, "train.py": entry})
    assert RepositoryModel.build(str(root)).facts(str(root / "lib.py"))["group"] == 1
    monkeypatch.chdir(root)
    out = _rewritten(root / "lib.py")
    assert "+    if dist.get_rank() == 0:\n+        print(\"sharding\")\n+    return n // dist.get_world_size(), dist.get_rank()" in out, out
    # another program runs it without a launcher: no group there, so the module keeps its guarded forms
    write(root, {"eval.py": "from lib import shard\n\nif __name__ == '__main__':\n    print(shard(8))\n"})
    assert "group" not in RepositoryModel.build(str(root)).facts(str(root / "lib.py"))
    assert "dist.get_rank() == 0:" not in _rewritten(root / "lib.py")


def test_a_backend_passed_to_a_function_of_another_file_is_a_backend_value(tmp_path):
    from neuron_migrate.repository.scan import call_attrs, sink_params

    utils = (b"import torch.distributed as dist\n\n\ndef setup(rank, backend: str = 'gloo', *, world=None):\n"
             b"    dist.init_process_group(backend=backend)\n\n\nclass Box:\n    def place(self, x, device):\n"
             b"        return x.to(device)\n")
    assert sink_params(utils) == {"setup": [[1, "backend"]], "place": [[1, "device"]]}
    caller = b"setup(0, cfg.dist_backend)\nsetup(1, backend=args.pg)\nbox.place(t, self.dev)\nsetup(0, 'gloo')\n"
    assert call_attrs(caller, sink_params(utils)) == {"dist_backend": 1, "pg": 2, "dev": 3}
    root = write(tmp_path / "r", {
        "pyproject.toml": "",
        "lib/__init__.py": "",
        "lib/config.py": "from dataclasses import dataclass\n\n\n@dataclass\nclass Cfg:\n    pg: str = \"nccl\"\n",
        "lib/utils.py": "import torch.distributed as dist\n\n\ndef setup(backend):\n    dist.init_process_group(backend=backend)\n",
        "train.py": "from lib.config import Cfg\nfrom lib.utils import setup\n\nif __name__ == '__main__':\n    cfg = Cfg()\n    setup(cfg.pg)\n",
    })
    assert RepositoryModel.build(str(root)).facts(str(root / "lib/config.py"))["sinks"] == {"pg": "train.py:6"}


def test_repository_root_memo_gives_each_folder_its_own_answer(tmp_path):
    """The walk up from many folders is shared (`memo`), and every folder still gets the nearest marker above it: a
    project nested in another, folders below each, asked in an order where the outer answer is known first."""
    outer = tmp_path / "outer"
    inner = outer / "libs" / "inner"
    for d in (outer / "a" / "b", inner / "src" / "pkg", outer / "libs" / "other"):
        d.mkdir(parents=True)
    (outer / "pyproject.toml").write_text("")
    (inner / "setup.py").write_text("")
    files = [outer / "a" / "b" / "x.py", outer / "libs" / "other" / "y.py", inner / "src" / "pkg" / "z.py",
             inner / "w.py", outer / "libs" / "v.py"]
    memo: dict = {}
    got = [repository_root(str(f), memo) for f in files]
    assert got == [repository_root(str(f)) for f in files]
    assert got == [str(outer), str(outer), str(inner), str(inner), str(outer)]
    assert memo[str(outer / "libs")] == str(outer) and memo[str(inner / "src")] == str(inner)


def test_a_test_module_that_imports_it_keeps_the_guarded_forms(tmp_path):
    """A test file is no program: it may call the module's functions without a process group."""
    root = write(tmp_path / "r", {
        "pyproject.toml": "",
        "lib.py": "import torch_xla.runtime as xr\n\n\ndef world():\n    return xr.world_size()\n",
        "train.py": "import torch_xla.distributed.xla_multiprocessing as xmp\nfrom lib import world\n\n\n"
                    "def _mp_fn(i):\n    print(world())\n\n\nif __name__ == '__main__':\n    xmp.spawn(_mp_fn)\n",
    })
    assert RepositoryModel.build(str(root)).facts(str(root / "lib.py"))["group"] == 1
    write(root, {"tests/test_lib.py": "from lib import world\n\n\ndef test_world():\n    assert world() == 1\n"})
    assert "group" not in RepositoryModel.build(str(root)).facts(str(root / "lib.py"))


LOADER_BASE = """\
    import torch_xla.distributed.parallel_loader as pl


    class Trainer:
        def __init__(self, device):
            self.device = device

        def make_loader(self, loader):
            return pl.MpDeviceLoader(loader, self.device)

        def train_epoch(self, loader, epoch):
            for data, target in loader:
                pass
"""


@pytest.mark.parametrize("entry, via", [
    ("loader = t.make_loader(data)\nprint(len(loader))\nfor e in range(2):\n    t.train_epoch(loader, e)", [["train_epoch", 0]]),
    ("t.train_epoch(t.make_loader(data), 0)", [["train_epoch", 0]]),
    ("loader = t.make_loader(data)\nfor x, y in loader:\n    pass", None),  # iterated outside the class
    ("loader = t.make_loader(data)\nother.train_epoch(loader, 0)", None),  # handed to another object
    ("make = t.make_loader\nmake(data)", None),  # the method goes on as a value
    ("loader = t.make_loader(data)\nreturn loader", None),
    ("loader = t.make_loader(data)\nloader._loader.sampler.set_epoch(0)\nt.train_epoch(loader, 0)", None),  # MpDeviceLoader's own attribute
])
def test_where_a_returned_device_loader_goes(tmp_path, entry, via):
    """NM130's repository facts: every call of a method that returns a device loader, in any file of the programs that
    may hold the object, and where its result goes (only into methods of the same object, or None)."""
    body = textwrap.indent(entry, "    ")
    root = write(tmp_path / "proj", {
        "pyproject.toml": "", "trainer.py": LOADER_BASE,
        "sub.py": "from trainer import Trainer\n\n\nclass Quiet(Trainer):\n    def build(self):\n        self.device = 'cpu'\n",
        "train.py": f"from sub import Quiet\n\n\ndef main(data, other):\n    t = Quiet('xla')\n{body}\n\n\n"
                    "if __name__ == '__main__':\n    main([], None)\n"})
    facts = RepositoryModel.build(str(root)).facts(str(root / "trainer.py"))
    assert facts["loaders"] == {"Trainer.make_loader": via}
    # the subclass in sub.py: its methods, and the attributes of trainer.py's that other files store
    assert facts["foreign"]["Trainer"]["defs"] == ["build"] and "device" in facts["foreign"]["Trainer"]["set"]


ENGINE = """\
import torch_xla.core.xla_model as xm


def train_one_epoch(model, loader, optimizer):
    for step, (data, target) in enumerate(loader):
        optimizer.zero_grad()
        model(data).sum().backward()
        xm.optimizer_step(optimizer)
    return len(loader)
"""


@pytest.mark.parametrize("entry, other, handed", [
    ("device = xm.xla_device()\n    train_one_epoch(model, pl.MpDeviceLoader(loader, device), opt)", "", True),
    ("train_loader = pl.MpDeviceLoader(loader, xm.xla_device())\n    print(len(train_loader))\n"
     "    train_one_epoch(model, train_loader, opt)", "", True),
    # the loader is also iterated here, or handed to something else too
    ("train_loader = pl.MpDeviceLoader(loader, xm.xla_device())\n    for b in train_loader:\n        pass\n"
     "    train_one_epoch(model, train_loader, opt)", "", False),
    ("train_loader = pl.MpDeviceLoader(loader, xm.xla_device())\n    train_one_epoch(model, train_loader, opt)\n"
     "    log(train_loader)", "", False),
    # another device than the process's own: the function cannot name it
    ("train_loader = pl.MpDeviceLoader(loader, xm.xla_device(1))\n    train_one_epoch(model, train_loader, opt)", "", False),
    # another file calls the function with a plain loader, through the module, or passes the function on
    ("train_one_epoch(model, pl.MpDeviceLoader(loader, xm.xla_device()), opt)",
     "from engine import train_one_epoch\n\n\ndef ev(m, loader, o):\n    train_one_epoch(m, loader, o)\n", False),
    ("train_one_epoch(model, pl.MpDeviceLoader(loader, xm.xla_device()), opt)",
     "import engine\n\n\ndef ev(m, loader, o):\n    engine.train_one_epoch(m, loader, o)\n", False),
    ("train_one_epoch(model, pl.MpDeviceLoader(loader, xm.xla_device()), opt)",
     "from engine import train_one_epoch\n\nSTEPS = {'train': train_one_epoch}\n", False),
])
def test_a_device_loader_handed_to_a_function_of_another_file(tmp_path, entry, other, handed):
    """NM130's repository facts for `train_one_epoch(model, pl.MpDeviceLoader(loader, device), opt)` where the function
    lives in engine.py and only iterates the loader: both files learn it from one answer, or neither does."""
    root = write(tmp_path / "proj", {
        "pyproject.toml": "", "engine.py": ENGINE, "other.py": other,
        "train.py": "import torch_xla.core.xla_model as xm\nimport torch_xla.distributed.parallel_loader as pl\n\n"
                    f"from engine import train_one_epoch\n\n\ndef main(model, loader, opt):\n    {entry}\n"})
    model = RepositoryModel.build(str(root))
    builder = model.facts(str(root / "train.py")) or {}
    callee = model.facts(str(root / "engine.py")) or {}
    if handed:
        assert builder["handed_loaders"] == {"train_one_epoch": [[1, "engine.py"]]}
        assert callee["loader_params"] == {"train_one_epoch": [1]}
    else:
        assert "handed_loaders" not in builder and "loader_params" not in callee


def test_the_handed_loader_is_plain_only_where_both_files_are_rewritten(tmp_path, monkeypatch):
    """The whole repository: the entry passes the plain DataLoader and engine.py's loop moves the batch (no helper);
    the entry alone (a pre-commit run, `rewrite train.py`): its loader keeps moving the batches itself, also when a
    cached answer of the whole run exists."""
    root = write(tmp_path / "proj", {
        "pyproject.toml": "", "engine.py": ENGINE,
        "train.py": "import torch_xla.core.xla_model as xm\nimport torch_xla.distributed.parallel_loader as pl\n\n"
                    "from engine import train_one_epoch\n\n\ndef main(model, loader, opt):\n"
                    "    device = xm.xla_device()\n    train_loader = pl.MpDeviceLoader(loader, device)\n"
                    "    train_one_epoch(model, train_loader, opt)\n"})
    monkeypatch.chdir(root)
    whole = cli("rewrite", ".", "--diff", "--unsafe-fixes")
    assert "_DeviceLoader" not in whole.output, whole.output
    assert "-    train_loader = pl.MpDeviceLoader(loader, device)\n" in whole.output
    assert "+    train_one_epoch(model, loader, opt)\n" in whole.output
    assert ('     for step, (data, target) in enumerate(loader):\n'
            '+        data, target = data.to("neuron"), target.to("neuron")\n') in whole.output
    for _ in range(2):  # uncached, then with the whole run's answers in the cache
        alone = cli("rewrite", "train.py", "--diff", "--unsafe-fixes")
        assert "+    train_loader = _DeviceLoader(loader, device)\n" in alone.output, alone.output
    assert cli("rewrite", ".", "--write", "--unsafe-fixes").exit_code in (0, 1)
    again = cli("rewrite", ".", "--diff", "--unsafe-fixes", "--no-cache")
    assert ".to(\"neuron\")" not in again.output, again.output  # the moved loop is not moved twice


SPMD_SUBCLASS = """\
    import os
    import sys
    sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(sys.argv[0]))))
    from train_base import TrainBase

    import numpy as np
    import torch_xla.distributed.parallel_loader as pl
    import torch_xla.distributed.spmd as xs
    from torch_xla import runtime as xr

    xr.use_spmd()


    class TrainSpmdDDP(TrainBase):

        def __init__(self):
            super().__init__()
            num_devices = xr.global_runtime_device_count()
            mesh = xs.Mesh(np.arange(num_devices), (num_devices,), ('data',))
            self.batch_size *= num_devices
            self.loader = pl.MpDeviceLoader(self.make(), self.device, input_sharding=xs.ShardingSpec(mesh, ('data', None)))


    if __name__ == '__main__':
        TrainSpmdDDP().start_training()
    """


def _spmd_base(model_line: str, extra: str = "") -> str:
    return f"""\
    import torch
    import torch_xla
    import torchvision

    from net import Net


    class TrainBase():

        def __init__(self):
            self.batch_size = 4
            self.device = torch_xla.device()
            {model_line}
            self.optimizer = torch.optim.SGD(
                self.model.parameters(), lr=0.1)
            {extra}

        def make(self):
            return [(torch.zeros(self.batch_size, 4),)] * 3

        def start_training(self):
            for (x,) in self.loader:
                self.optimizer.zero_grad()
                self.model(x).sum().backward()
                self.optimizer.step()
    """


@pytest.mark.parametrize(("model_line", "extra", "expect"), [
    ("self.model = Net().to(self.device)", "", None),
    ("self.model = torchvision.models.resnet50().to(self.device)", "",
     "may hold BatchNorm layers (torchvision.models.resnet50 is not a model class of this repository)"),
    ("self.model = Net(norm=True).to(self.device)", "", "may hold BatchNorm layers (examples/net.py uses BatchNorm)"),
    ("self.model = Net().to(self.device)", "self.step = torch.compile(self.model)",
     "TrainBase.__init__ (examples/train_base.py): line 16 reads or sets `self.model` (a reference kept there would bypass the wrap)"),
    ("self.model = Net().to(self.device)", "self.loader = self.make()",
     "TrainBase.__init__ (examples/train_base.py): line 16 calls a method of self or hands self on"),
])
def test_nm150_wraps_the_model_a_base_class_in_another_file_builds(tmp_path, monkeypatch, model_line, extra, expect):
    """pytorch/xla's examples/data_parallel/train_resnet_spmd_data_parallel.py: the SPMD subclass (data_parallel/)
    imports its base class from the parent folder (sys.path), whose __init__ builds self.model and the optimizer on
    its parameters. DDP wraps self.model right after the mesh (the optimizer keeps the same parameter objects) when
    the repository model shows that base: one optimizer, the model read nowhere else in that __init__, no method of
    self called there, and a model class of this repository without BatchNorm (SPMD normalised over the global batch).
    Otherwise the finding at the loader's sharding says what to write."""
    net = "import torch.nn as nn\n\n\nclass Net(nn.Module):\n    def __init__(self, norm=False):\n        super().__init__()\n" \
          "        self.fc = nn.Linear(4, 2)\n        self.norm = nn.BatchNorm1d(2) if norm else nn.Identity()\n\n" \
          "    def forward(self, x):\n        return self.norm(self.fc(x))\n"
    if "norm=True" not in model_line:
        net = net.replace("nn.BatchNorm1d(2) if norm else ", "")
    root = write(tmp_path / "r", {"pyproject.toml": "", "examples/net.py": net,
                                  "examples/train_base.py": _spmd_base(model_line, extra),
                                  "examples/data_parallel/train_spmd.py": SPMD_SUBCLASS})
    monkeypatch.chdir(root)
    out = _audit(root / "examples/data_parallel/train_spmd.py")
    fixed = _rewritten(root / "examples/data_parallel/train_spmd.py")
    if expect is None:
        assert ("+        mesh = init_device_mesh(\"neuron\", (num_devices,), mesh_dim_names=('data',))\n"
                "+        self.model = DistributedDataParallel(self.model, device_mesh=mesh[\"data\"])\n"
                "         self.batch_size *= num_devices\n") in fixed, fixed
        assert '_BatchSlices(self.make(), mesh["data"])' in fixed
        assert not [line for line in fixed.splitlines() if line.startswith("+") and "xs." in line]
        return
    assert expect in out, out
    assert "DistributedDataParallel(" not in fixed and "init_device_mesh" not in fixed
    if "BatchNorm" in expect:
        assert ("Write `self.model = DistributedDataParallel(nn.SyncBatchNorm.convert_sync_batchnorm(self.model, "
                "mesh['data'].get_group()), device_mesh=mesh['data'])` right after the mesh") in out
    else:
        assert "write `self.model = DistributedDataParallel(self.model, device_mesh=mesh['data'])` right after the mesh" in out


SPMD_DP_SCRIPT = """\
    import numpy as np
    import torch
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    from model import Net

    xr.use_spmd()


    def train(loader):
        num_devices = xr.global_runtime_device_count()
        mesh = xs.Mesh(np.arange(num_devices), (num_devices,), ("data",))
        device = xm.xla_device()
        model = Net().to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for data, target in loader:
            data, target = data.to(device), target.to(device)
            xs.mark_sharding(data, mesh, ("data", None))
            xs.mark_sharding(target, mesh, ("data",))
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(data), target).backward()
            optimizer.step()


    if __name__ == "__main__":
        train([])
    """


@pytest.mark.parametrize(("norm", "layers", "expect"), [
    ("", "", None),
    ("import torch.nn as nn\n", "nn.BatchNorm1d(4)", "may hold BatchNorm layers (model.py uses BatchNorm)"),
    ("from layers import Block\n", "Block()", "may hold BatchNorm layers (layers.py uses BatchNorm)"),
    ("import timm\n", "timm.layers.Mlp(4)", "may hold BatchNorm layers (model.py imports timm, whose modules may hold BatchNorm)"),
])
def test_nm150_single_file_data_parallel_checks_the_model_for_batchnorm(tmp_path, monkeypatch, norm, layers, expect):
    """A one-file SPMD data-parallel program whose model class comes from another repository file: DDP alone is the
    rewrite only when that class (and what it imports from the repository) holds no BatchNorm, since XLA SPMD
    normalised over the global batch and a process per device normalises its slice; otherwise the finding gives the
    SyncBatchNorm form and the file keeps its SPMD program."""
    extra = f"\n        self.extra = {layers}" if layers else ""
    net = (f"import torch\n{norm}\n\nclass Net(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
           f"        self.fc = torch.nn.Linear(4, 2){extra}\n\n    def forward(self, x):\n        return self.fc(x)\n")
    root = write(tmp_path / "r", {"pyproject.toml": "", "model.py": net, "train.py": SPMD_DP_SCRIPT,
                                  "layers.py": "import torch.nn as nn\n\n\nclass Block(nn.Sequential):\n"
                                               "    def __init__(self):\n        super().__init__(nn.BatchNorm1d(4))\n"})
    monkeypatch.chdir(root)
    out = _audit(root / "train.py")
    fixed = _rewritten(root / "train.py")
    if expect is None:
        assert ('+    model = DistributedDataParallel(model, device_mesh=mesh["data"])\n'
                "     optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n") in fixed, fixed
        return
    assert expect in out, out
    assert ("Write `model = DistributedDataParallel(nn.SyncBatchNorm.convert_sync_batchnorm(model, "
            "mesh['data'].get_group()), device_mesh=mesh['data'])` after the mesh and before the optimizer") in out
    assert "DistributedDataParallel(" not in fixed and "init_device_mesh" not in fixed


SCRIPT = """\
    import torch
    import torch_xla.core.xla_model as xm

    from helpers import make_model

    device = "xla"
    model = make_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        loss = model(torch.ones(2, 4, device=device)).sum()
        loss.backward()
        xm.optimizer_step(optimizer)
"""


def test_a_script_without_a_main_guard_that_no_file_imports_is_a_program(tmp_path, monkeypatch):
    """A training loop written at module level (no `if __name__ == "__main__":`), in a file no other file imports, is
    a single-process program: xm.optimizer_step's average over one process is nothing, so it is a plain step. The
    same file imported by another keeps the average (its loop may run inside that program)."""
    root = write(tmp_path, {"pyproject.toml": "", "train.py": SCRIPT,
                            "helpers.py": "import torch\n\n\ndef make_model():\n    return torch.nn.Linear(4, 2)\n"})
    monkeypatch.chdir(root)
    assert scan_python((root / "train.py").read_bytes()).get("tl") == 1
    assert "tl" not in scan_python(b'"""Loops:\n\nfor each batch the model steps\n"""\nimport torch\n')
    facts = repository_facts([str(root / "train.py"), str(root / "helpers.py")])
    assert facts[str(root / "train.py")].get("script") == 1 and "script" not in (facts.get(str(root / "helpers.py")) or {})
    out = _rewritten(root / "train.py")
    assert "+    optimizer.step()" in out and "_neuron_" not in out, out
    (root / "run.py").write_text("import train  # noqa: F401\n")
    out = _rewritten(root / "train.py")
    assert "_neuron_reduce_gradients(optimizer)" in out, out


def test_files_that_pick_the_device_among_accelerators_are_facts_of_the_modules_they_run(tmp_path):
    """build-nanogpt split in two: train_gpt2.py (no `__main__` guard) picks cuda, mps or cpu and passes its device type
    to model.py, which asks `device_type == "cuda"`: model.py learns which file of its program picks the device (NM201
    then keeps that test, since the picker still hands out CUDA devices on GPU hosts)."""
    picker = ('import torch\nfrom model import use_fused\n\ndevice = "cpu"\nif torch.cuda.is_available():\n    device = "cuda"\n'
              'elif torch.backends.mps.is_available():\n    device = "mps"\ndevice_type = "cuda" if device.startswith("cuda") '
              'else "cpu"\nfor step in range(3):\n    print(use_fused(device_type))\n')
    assert scan_python(picker.encode()).get("dp") == 1
    assert "dp" not in scan_python(b"import torch\nif torch.cuda.is_available():\n    x = 1\n")
    root = write(tmp_path / "r", {
        "pyproject.toml": "",
        "train_gpt2.py": picker,
        "model.py": "def use_fused(device_type):\n    return device_type == \"cuda\"\n",
        "other.py": "def f():\n    return 1\n",
    })
    model = RepositoryModel.build(str(root))
    assert model.facts(str(root / "model.py"))["pickers"] == ["train_gpt2.py"]
    assert "pickers" not in (model.facts(str(root / "train_gpt2.py")) or {})
    assert "pickers" not in (model.facts(str(root / "other.py")) or {})


def test_nm166_sharding_after_a_base_class_built_the_optimizer(tmp_path):
    """pytorch/xla's tensor_parallel/train_decoder_only_spmd_tp.py: the subclass shards the MLPs after
    super().__init__(), whose class (another file, reached through sys.path) built `self.optimizer` over
    `self.model.parameters()`: the sharded weights would never train. A subclass that builds it again after is fine."""
    base = ("import torch\n\n\nclass TrainBase:\n    def __init__(self):\n        self.model = torch.nn.Linear(2, 2)\n"
            "        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-4)\n")
    tp = ("import os\nimport sys\n\nimport torch\nsys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(sys.argv[0]))))\n"
          "from train_base import TrainBase\n\nfrom torch.distributed.tensor import init_device_mesh\n"
          "from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module\n\n\n"
          "class TrainTP(TrainBase):\n    def __init__(self):\n        super().__init__()\n"
          "        mesh = init_device_mesh('xla', (2,))\n        parallelize_module(self.model, mesh, ColwiseParallel())\n"
          "{again}\n\nif __name__ == '__main__':\n    TrainTP()\n")
    for again, found in (("", True), ("        self.optimizer = torch.optim.Adam(self.model.parameters())\n", False)):
        root = write(tmp_path / f"proj{int(found)}", {"pyproject.toml": "", "train_base.py": base,
                                                      "tensor_parallel/train_tp.py": tp.format(again=again)})
        out = _audit(root)
        assert ("NM166" in out) is found, out
        if found:
            assert "TrainBase.__init__ builds over `self.model.parameters()` (train_base.py:7" in out, out
