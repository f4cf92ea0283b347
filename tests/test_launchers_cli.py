"""Launchers, job files and dependency lists through the CLI: discovery, byte-exact writes, unparsable files left
alone, suppressions, output formats; and notebook findings that name their cell."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

CLI = [sys.executable, "-m", "neuron_migrate"]


def _run(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def test_discovery_picks_up_every_kind(tmp_path):
    from neuron_migrate.files.discover import discover, file_kind

    names = {"run.sh": "shell", "a.bash": "shell", "job.slurm": "shell", "job.sbatch": "shell", "Dockerfile": "dockerfile",
             "Dockerfile.gpu": "dockerfile", ".env": "env", "prod.env": "env", "k8s.yaml": "yaml", "ci.yml": "yaml",
             "requirements.txt": "requirements", "requirements-dev.txt": "requirements", "pyproject.toml": "pyproject",
             "setup.py": "setup.py", "setup.cfg": "setup.cfg", "environment.yml": "conda", "train.py": "python",
             "nb.ipynb": "notebook"}
    for n in [*names, "README.md", "notes.txt", "data.json"]:
        (tmp_path / n).write_text("x\n")
    files, _ = discover([str(tmp_path)])
    assert sorted(f.name for f in files) == sorted(names)
    assert {n: file_kind(n) for n in names} == names


def test_unparsable_launcher_is_reported_and_never_rewritten(tmp_path):
    text = b"#!/bin/bash\nexport PJRT_DEVICE=NEURON\nif [ \"$X\" = 1 ; then\n  python train.py\n"
    (tmp_path / "run.sh").write_bytes(text)
    p = _run("rewrite", "--write", "run.sh", cwd=tmp_path)
    # nothing could be rewritten: findings left for manual work fail a rewrite only with --fail-level (issue 15)
    assert p.returncode == 0 and "Traceback" not in p.stderr and "NM500" in p.stdout
    assert _run("rewrite", "--write", "--fail-level", "warning", "run.sh", cwd=tmp_path).returncode == 1
    assert (tmp_path / "run.sh").read_bytes() == text
    out = json.loads(_run("audit", "-f", "json", "run.sh", cwd=tmp_path).stdout)
    assert {f["code"] for f in out} == {"NM500", "NM501"} and all(f["fix"] is None for f in out)


def test_write_keeps_bytes_mode_and_line_endings(tmp_path):
    text = b"#!/bin/bash\r\nexport PJRT_DEVICE=NEURON  # xla\r\nexport NEURON_CC_FLAGS=\"--auto-cast=none\"\r\n\xc3\xa9cho=1\r\ntorchrun --nproc_per_node=2 t.py\r\n"
    f = tmp_path / "run.sh"
    f.write_bytes(text)
    os.chmod(f, 0o750)
    p = _run("rewrite", "--write", "run.sh", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f.read_bytes() == text.replace(b"export PJRT_DEVICE=NEURON  # xla\r\n", b"")
    assert f.stat().st_mode & 0o777 == 0o750


def test_suppressions_in_job_files(tmp_path):
    (tmp_path / "Dockerfile").write_text("FROM x\n# neuron-migrate: ignore-file[NM5]\nENV PJRT_DEVICE=NEURON\n")
    (tmp_path / "requirements.txt").write_text("torch==2.13.0\ntorch-xla==2.9.0  # neuron-migrate: ignore[NM601]\n")
    (tmp_path / "run.sh").write_text("export XLA_FLAGS=x  # noqa: NM501\nexport XLA_IR_DEBUG=1\n")
    out = json.loads(_run("audit", "-f", "json", ".", cwd=tmp_path).stdout)
    assert [(f["location"]["path"], f["location"]["row"], f["code"]) for f in out] == [("run.sh", 2, "NM501")]


def test_output_formats_for_launcher_findings(tmp_path):
    (tmp_path / "run.sh").write_text("#!/bin/bash\n  export XLA_IR_DEBUG=1\n")
    js = json.loads(_run("audit", "-f", "json", "run.sh", cwd=tmp_path).stdout)
    assert js[0]["location"]["row"] == 2 and js[0]["location"]["column"] == 10 and js[0]["fix"]["applicability"] == "safe"
    sarif = json.loads(_run("audit", "-f", "sarif", "run.sh", cwd=tmp_path).stdout)
    res = sarif["runs"][0]["results"][0]
    assert res["ruleId"] == "NM501" and res["locations"][0]["physicalLocation"]["region"]["startLine"] == 2
    assert any(r["id"] == "NM501" for r in sarif["runs"][0]["tool"]["driver"]["rules"])
    gh = _run("audit", "-f", "github", "run.sh", cwd=tmp_path).stdout
    assert gh.startswith("::warning file=run.sh,line=2,col=10")
    concise = _run("audit", "-f", "concise", "run.sh", cwd=tmp_path).stdout
    assert concise.startswith("run.sh:2:10: NM501")


def test_notebook_findings_name_the_cell(tmp_path):
    cells = [{"cell_type": "markdown", "metadata": {}, "source": ["# title\n"]},
             {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
              "source": ["import torch\n", "import torch_xla.core.xla_model as xm\n"]},
             {"cell_type": "markdown", "metadata": {}, "source": ["text\n"]},
             {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
              "source": ["x = torch.ones(2)\n", "\n", "y = x.to(xm.xla_device())\n", "print(y)\n"]}]
    nb = {"cells": cells, "metadata": {"language_info": {"name": "python"}}, "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / "train.ipynb").write_text(json.dumps(nb, indent=1))
    text = _run("audit", "-f", "concise", "--select", "NM102", "train.ipynb", cwd=tmp_path).stdout
    assert text.startswith("train.ipynb:cell 4:3:10: NM102"), text
    js = json.loads(_run("audit", "-f", "json", "--select", "NM102", "train.ipynb", cwd=tmp_path).stdout)
    assert js[0]["location"]["cell"] == 4 and js[0]["location"]["row"] == 3 and js[0]["location"]["column"] == 10
    sarif = json.loads(_run("audit", "-f", "sarif", "--select", "NM102", "train.ipynb", cwd=tmp_path).stdout)
    res = sarif["runs"][0]["results"][0]
    assert res["properties"]["cell"] == 4 and res["locations"][0]["logicalLocations"][0]["name"] == "cell 4"
    assert res["locations"][0]["physicalLocation"]["region"]["startLine"] == 3


def test_report_bad_probe_file_is_one_line(tmp_path):
    (tmp_path / "p.json").write_text("{not json")
    p = _run("report", ".", "--probe", "p.json", "-o", "r.html", cwd=tmp_path)
    assert p.returncode == 2 and "Traceback" not in p.stderr and "--probe p.json" in p.stderr


def test_launcher_results_follow_the_script_they_start(tmp_path):
    """NM505 reads the started script: a cached launcher result must not outlive a change of that script."""
    (tmp_path / "run.sh").write_text("python train.py\n")
    (tmp_path / "train.py").write_text("print('plain script')\n")
    assert json.loads(_run("audit", "-f", "json", "run.sh", cwd=tmp_path).stdout) == []
    (tmp_path / "train.py").write_text("import torch_xla.distributed.xla_multiprocessing as xmp\nxmp.spawn(print, args=())\n")
    out = json.loads(_run("audit", "-f", "json", "run.sh", cwd=tmp_path).stdout)
    assert [f["code"] for f in out] == ["NM505"]


def test_unreadable_yaml_without_migration_content_is_quiet(tmp_path):
    (tmp_path / "chart.yaml").write_text("script:\n  - python {{ .Values.x }\nbad: [\n")
    p = _run("audit", "chart.yaml", cwd=tmp_path)
    assert p.returncode == 0, p.stdout


def test_pre_commit_hooks_pass_exactly_the_files_discovery_knows():
    import re

    import yaml

    from neuron_migrate.files.discover import _wanted

    hooks = yaml.safe_load((Path(__file__).resolve().parents[1] / ".pre-commit-hooks.yaml").read_text())
    names = ["a.py", "b.pyi", "nb.ipynb", "run.sh", "x.bash", "j.slurm", "j.sbatch", "Dockerfile", "Dockerfile.gpu",
             "api.dockerfile", "Containerfile", ".env", ".env.local", "prod.env", "k8s.yaml", "ci.yml", "environment.yml",
             "requirements.txt", "requirements-dev.txt", "requirements/base.in", "dev-requirements.txt", "pyproject.toml",
             "setup.py", "setup.cfg", "README.md", "notes.txt", "myrequirementsfoo.txt", "setup.pyc", "data.json", "Makefile"]
    for hook in hooks:
        rx = re.compile(hook["files"])
        for n in names:
            assert bool(rx.search(n)) == _wanted(n.rsplit("/", 1)[-1]), (hook["id"], n)


def test_a_refused_file_is_told_what_to_do_not_what_was_done(tmp_path):
    """NM500 refuses a launcher or job file: its other findings say what to do by hand, never "removed" (issue 38)."""
    broken = "#!/bin/bash\nexport XLA_IR_DEBUG=1\nexport NEURONCORE_NUM_DEVICES=2\nif [ \"$X\" = 1 ; then\n  python train.py\n"
    good = "#!/bin/bash\nexport XLA_IR_DEBUG=1\npython train.py\n"
    (tmp_path / "run.sh").write_text(broken)
    (tmp_path / "ok.sh").write_text(good)
    out = json.loads(_run("audit", "-f", "json", ".", cwd=tmp_path).stdout)
    by_file: dict = {}
    for f in out:
        by_file.setdefault(Path(f["location"]["path"]).name, []).append(f)
    refused = [f for f in by_file["run.sh"] if f["code"] != "NM500"]
    assert [f["code"] for f in by_file["run.sh"]].count("NM500") == 1 and len(refused) == 2
    assert all("removed" not in f["message"] and f["fix"] is None for f in refused), refused
    assert "XLA_IR_DEBUG is read only by torch_xla / the XLA flow: remove it by hand" in refused[0]["message"]
    # the same variable in a file that is rewritten: the fix removes it, and the message says so
    assert [f["message"].split(";")[0] for f in by_file["ok.sh"]] == ["XLA_IR_DEBUG is read only by torch_xla / the XLA flow: removed"]
