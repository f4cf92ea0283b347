"""Run the original and the migrated program side by side and compare them.

The original runs under torch_xla on XLA's CPU backend (PJRT_DEVICE=CPU) in the XLA environment (xla_env), the
migrated program natively on the migrated side's torch (the emulated `neuron` device, which computes on the
host). Each side is `bootstrap.py` in its own process group, with a timeout, one thread, the same seed, the same
host-drawn random numbers, and world size 1 (XLA's CPU backend cannot run two replicas: `xmp.spawn` with two CPU
devices deadlocks at the first all-reduce, and torchrun with the `xla` backend on CPU averages nothing).

When the runs part, the first diverging step is replayed on both sides with module hooks to name the module,
and the module's or optimizer's lines on the migrated side are matched against the change map.

No torch in the parent until the comparison (compare.py loads the recorded tensors).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from neuron_migrate.verify.changes import SKIP_DIRS, change_map, hunks_at_original, hunks_in, python_files

BOOTSTRAP = Path(__file__).with_name("bootstrap.py")
NM_ROOT = str(Path(__file__).resolve().parents[2])

EXIT_EQUIVALENT, EXIT_DIVERGED, EXIT_CANNOT_RUN, EXIT_NO_XLA = 0, 1, 2, 3


class CannotRun(Exception):
    pass


class Side(dict):
    """{'name': 'original'|'migrated', 'python', 'kind': 'xla'|'native', 'emulate': bool, 'root': project dir}"""


# ------------------------------------------------------------------------------------------- the two trees


def copy_tree(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, ignore=lambda d, names: [n for n in names if n in SKIP_DIRS or n.endswith(".pyc")],
                    dirs_exist_ok=True)


def rewrite_tree(root: Path, unsafe_fixes: bool | None = None, config_from: Path | None = None) -> dict[str, list[tuple[str, int]]]:
    """Rewrite every .py under `root` in place, as `neuron-migrate rewrite --write` would with the project's
    [tool.neuron-migrate] configuration (found from `config_from`, the original project; `unsafe_fixes` overrides
    it when given); returns the change map's rule codes: {relative path: [(code, line in the rewritten text)]}."""
    from neuron_migrate.files.config import find_pyproject, load_file
    from neuron_migrate.rewrite.engine import FixError, fix_text
    from neuron_migrate.rules.api import Settings
    from neuron_migrate.rules.registry import RuleSet

    pyproject = find_pyproject(config_from or root)
    cfg = load_file(pyproject) if pyproject else None
    if cfg is not None:
        ruleset = RuleSet.select(cfg.select + cfg.extend_select, cfg.ignore)
        settings = Settings(device_style=cfg.device_style, table_path=cfg.table,
                            unsafe_fixes=cfg.unsafe_fixes if unsafe_fixes is None else unsafe_fixes)
    else:
        ruleset, settings = RuleSet.select(), Settings(unsafe_fixes=bool(unsafe_fixes))
    fixes: dict[str, list[tuple[str, int]]] = {}
    for rel in python_files(root):
        path = root / rel
        text = path.read_text(encoding="utf-8")
        if not ruleset.could_match(text):
            continue
        try:
            out = fix_text(text, rel, ruleset, settings)
        except (FixError, SyntaxError, ValueError):
            continue
        if out.text != text:
            path.write_text(out.text, encoding="utf-8")
            fixes[rel] = [(f.rule.code, f.span.line) for f in out.applied_findings]
    return fixes


def _uses_torch_xla(root: Path) -> bool:
    return any("torch_xla" in (root / rel).read_text(encoding="utf-8", errors="replace") for rel in python_files(root))


def _git_head_tree(root: Path, dest: Path) -> bool:
    """The files of `root` as committed at git HEAD, into `dest`; False when `root` is not in a git repository."""
    try:
        top = subprocess.run(["git", "-C", str(root), "rev-parse", "--show-toplevel"], capture_output=True,
                             text=True, check=True).stdout.strip()
        rel = os.path.relpath(root, top)
        names = subprocess.run(["git", "-C", top, "ls-tree", "-r", "--name-only", "HEAD", "--", rel],
                               capture_output=True, text=True, check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return False
    if not names:
        return False
    for name in names:
        blob = subprocess.run(["git", "-C", top, "show", f"HEAD:{name}"], capture_output=True, check=True).stdout
        target = dest / os.path.relpath(name, rel)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(blob)
    return True


def prepare_trees(project: Path, work: Path, original: Path | None = None, unsafe_fixes: bool | None = None) -> dict:
    """{'original': dir, 'migrated': dir, 'how': why these two, 'hunks': change map}.

    --original DIR: that tree against the project as it is. A project that still uses torch_xla: the project as
    it is against its rewrite (in a copy). An already migrated project: its git HEAD against the working tree."""
    fixes: dict = {}
    if original is not None:
        orig, migrated, how = original, project, f"the original in {original} against {project} as it is"
    elif _uses_torch_xla(project):
        migrated = work / "migrated"
        copy_tree(project, migrated)
        fixes = rewrite_tree(migrated, unsafe_fixes, config_from=project)
        orig, how = project, "the files as they are against their rewrite (a temporary copy)"
    else:
        orig = work / "original"
        if not _git_head_tree(project, orig) or not _uses_torch_xla(orig):
            raise CannotRun(f"{project} does not use torch_xla, and its git HEAD has no torch_xla version to "
                            "compare with: pass the unmigrated program with --original DIR")
        migrated, how = project, "the git HEAD version (unmigrated) against the working tree (migrated)"
    return {"original": orig, "migrated": migrated, "how": how, "hunks": change_map(orig, migrated, fixes)}


# -------------------------------------------------------------------------------------------- running a side


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, n: int = 3000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-n:].decode("utf-8", errors="replace")


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=3)
    except (ProcessLookupError, PermissionError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()


def run_side(side: Side, script: str, args: list[str], out: Path, *, steps: int, seed: int = 0, float64: bool = False,
             hook_step: int | None = None, timeout: float = 600.0, threads: int = 1, host_rng: bool = True,
             nproc: int = 1) -> dict:
    """Run one side to `steps` optimizer steps; returns {'meta', 'data_path', 'stdout', 'stderr', 'seconds'}.
    Raises CannotRun with the program's own error when it fails before recording anything useful."""
    out.mkdir(parents=True, exist_ok=True)
    root = Path(side["root"])
    spec = {"side": side["kind"], "script": str(root / script), "args": list(args), "cwd": str(root), "out": str(out),
            "steps": steps, "seed": seed, "float64": float64, "hook_step": hook_step, "threads": threads,
            "host_rng": host_rng, "emulate": bool(side.get("emulate")), "nm_root": NM_ROOT}
    (out / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
    env = dict(os.environ)
    for k in ("CPU_NUM_DEVICES", "XLA_USE_BF16", "XLA_DOWNCAST_BF16", "NEURON_RT_VISIBLE_CORES"):
        env.pop(k, None)
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONHASHSEED=str(seed),
               TF_CPP_MIN_LOG_LEVEL="3", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
               GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), PYTHONDONTWRITEBYTECODE="1")
    if side["kind"] == "xla":
        env["PJRT_DEVICE"] = "CPU"
        # never a folder that holds another torch (the migrated side's site-packages) or a start-up hook (a
        # sitecustomize.py, such as the emulated device's); the user's other folders (their own packages) stay
        own = [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
               if p and not (Path(p) / "torch").is_dir() and not (Path(p) / "sitecustomize.py").is_file()]
        env["PYTHONPATH"] = os.pathsep.join([str(root), *own])
        env.pop("PYTHONHOME", None)
    else:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
    cmd = [side["python"], str(BOOTSTRAP), str(out / "spec.json")]
    if nproc > 1:  # torchrun sets RANK, WORLD_SIZE and the rendezvous itself
        for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(k, None)
        cmd = [side["python"], "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
               str(BOOTSTRAP), str(out / "spec.json")]
    start = time.monotonic()
    with open(out / "stdout.txt", "wb") as so, open(out / "stderr.txt", "wb") as se:
        proc = subprocess.Popen(cmd, stdout=so, stderr=se, cwd=str(root), env=env, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise CannotRun(f"the {side['name']} program did not reach {steps} steps within {timeout:.0f} s "
                            "(--timeout)") from None
    seconds = time.monotonic() - start
    if nproc > 1:
        ranks = []
        for r in range(nproc):
            mp = out / f"rank{r}" / "meta.json"
            if not mp.exists():
                raise CannotRun(f"rank {r} of the {side['name']} program under torchrun ({nproc} processes) ended with "
                                f"status {proc.returncode} before recording anything:\n{_tail(out / 'stderr.txt')}")
            ranks.append({"meta": json.loads(mp.read_text(encoding="utf-8")),
                          "data_path": str(out / f"rank{r}" / "tensors.pt")})
        return {"ranks": ranks, "stdout": _tail(out / "stdout.txt"), "stderr": _tail(out / "stderr.txt"), "seconds": seconds}
    meta_path = out / "meta.json"
    if not meta_path.exists():
        raise CannotRun(f"the {side['name']} program ({side['kind']}) ended with status {proc.returncode} "
                        f"before recording anything:\n{_tail(out / 'stderr.txt')}")
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    return {"meta": meta, "data_path": str(out / "tensors.pt"), "stdout": _tail(out / "stdout.txt"),
            "stderr": _tail(out / "stderr.txt"), "seconds": seconds}


def load_data(path: str) -> dict:
    import torch

    if not os.path.exists(path):
        return {}
    return torch.load(path, map_location="cpu", weights_only=True)


# ---------------------------------------------------------------------------------------------- the verdict


def _rel_to(path: str, root: Path) -> str:
    try:
        rel = os.path.relpath(os.path.realpath(path), os.path.realpath(root))
    except ValueError:
        return path
    return path if rel.startswith("..") else rel.replace(os.sep, "/")


def _where_optimizer(meta_b: dict, migrated: Path, hunks: list) -> dict:
    sites = meta_b.get("optimizers") or []
    if not sites:
        return {}
    site = sites[0]
    rel = _rel_to(site.get("path", ""), migrated)
    touching = hunks_in(hunks, rel, site.get("line", 0), site.get("line", 0))
    return {"optimizer": site.get("class"), "source": f"{rel}:{site.get('line')}", "hunks": touching}


def _where_module(found: dict, migrated: Path, hunks: list) -> dict:
    row = found.get("row") or {}
    out = {"module": found.get("module"), "phase": found.get("phase"), "detail": found.get("detail")}
    if row.get("path"):
        rel = _rel_to(row["path"], migrated)
        if os.path.isabs(rel):  # a library's module (torch.nn.Linear): no line of the program to point at
            out["source"] = f"{row.get('class')} (library code)"
        else:
            out["source"] = f"{rel}:{row.get('first')}"
            out["hunks"] = hunks_in(hunks, rel, row.get("first", 0), row.get("last", 0))
    return out


def _where_mode(first: dict, metas: dict, trees: dict, hunks: list) -> dict:
    """A module in the other training mode: the program's `train()` / `eval()` calls that a change removed, added
    or altered (a lost `model.train()` is a deletion hunk, found at its line in the original), else the migrated
    program's last such call before the step."""
    out = {"module": first.get("module"), "phase": "mode", "detail": first.get("detail")}
    step = first.get("step") or 0
    touching: list = []
    sites = []
    for name in ("original", "migrated"):
        for call in metas[name].get("mode_calls") or []:
            rel = _rel_to(call.get("path", ""), Path(trees[name]))
            if os.path.isabs(rel) or call.get("step", 0) > step:
                continue
            line = call.get("line", 0)
            found = hunks_at_original(hunks, rel, line) if name == "original" else hunks_in(hunks, rel, line, line)
            call_text = "train()" if call.get("mode") else "eval()"
            sites.append((name, rel, line, call_text))
            for h in found:
                if h not in touching:
                    touching.append(h)
                    out.setdefault("source", f"{rel}:{line}" + (" of the original" if name == "original" else ""))
                    out.setdefault("call", f"{call_text} at {rel}:{line} of the {name} program")
    if not touching:
        last = [s for s in sites if s[0] == "migrated"]
        if last:
            _, rel, line, call_text = last[-1]
            out["source"] = f"{rel}:{line}"
            touching = hunks_in(hunks, rel, line, line)
    out["hunks"] = touching
    return out


def _where_collective(first: dict, meta_orig: dict, original: Path, meta: dict, migrated: Path, hunks: list) -> dict:
    """An N-process divergence: the gradient collectives rank 0 called at that step (where a reduction was added:
    its places) and the changes on their lines or the line after (where a division or scale of the result sits;
    a deletion counts at the line it left)."""
    from neuron_migrate.verify.compare import collectives_per_step

    if first.get("what") == "world size":
        return {}
    if first.get("what") == "ranks" or first.get("dropped"):  # the original's reduction, and the change that lost it
        out: dict = {}
        for kind, grad, path, line, _n in collectives_per_step(meta_orig).get(first.get("step") or 0, []):
            rel = _rel_to(path, original)
            if grad and not os.path.isabs(rel):
                found = hunks_at_original(hunks, rel, line)
                if found or not out:
                    out = {"collective": kind, "source": f"{rel}:{line} of the original", "hunks": found}
                if found:
                    break
        return out
    entries = collectives_per_step(meta).get(first.get("step") or 0, [])
    sites = [(path, line, kind) for kind, grad, path, line, _n in entries if grad]
    out: dict = {}
    touching: list = []
    for path, line, kind in sites:
        rel = _rel_to(path, migrated)
        if os.path.isabs(rel):
            continue
        out.setdefault("collective", kind)
        out.setdefault("source", f"{rel}:{line}")
        for h in hunks_in(hunks, rel, line, line + 1):
            if h not in touching:
                touching.append(h)
                out["collective"], out["source"] = kind, f"{rel}:{line}"
    if out:
        out["hunks"] = touching
    return out


def verify(project: Path, script: str, args: list[str], *, xla_python: str, steps: int = 20, seed: int = 0,
           float64: bool = False, timeout: float = 600.0, original: Path | None = None, native_original: bool = False,
           emulate: bool = True, localise: bool = True, check_determinism: bool = False, keep: Path | None = None,
           unsafe_fixes: bool | None = None, nproc: int = 1, log=None) -> dict:
    """The whole check. `native_original`: run the original side natively too (tests; programs without
    torch_xla). Returns the result dict (see render_text); raises CannotRun."""
    log = log or (lambda msg: None)
    project = project.resolve()
    work = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="nm-verify-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        trees = prepare_trees(project, work, original.resolve() if original else None, unsafe_fixes)
        migrated = Path(trees["migrated"])
        if "torch_xla" in " ".join((migrated / rel).read_text(encoding="utf-8", errors="replace")
                                   for rel in python_files(migrated)) and not native_original:
            still = [rel for rel in python_files(migrated) if "import torch_xla" in (migrated / rel).read_text(
                encoding="utf-8", errors="replace") or "from torch_xla" in (migrated / rel).read_text(
                encoding="utf-8", errors="replace")]
            if still:
                raise CannotRun("the migrated program still imports torch_xla (" + ", ".join(still) + "): the "
                                "migration is incomplete (see `neuron-migrate rewrite`'s manual items), so it cannot "
                                "run natively")
        sides = {
            "original": Side(name="original", python=sys.executable if native_original else xla_python,
                             kind="native" if native_original else "xla", emulate=native_original and emulate,
                             root=str(trees["original"])),
            "migrated": Side(name="migrated", python=sys.executable, kind="native", emulate=emulate,
                             root=str(migrated)),
        }
        common = dict(steps=steps, seed=seed, float64=float64, timeout=timeout)
        runs, seconds = {}, {}
        for name in ("original", "migrated"):
            log(f"running the {name} program ({sides[name]['kind']}) for {steps} steps")
            runs[name] = run_side(sides[name], script, args, work / name, **common)
            seconds[name] = runs[name]["seconds"]
        result = {"project": str(project), "script": script, "how": trees["how"], "steps_requested": steps,
                  "seed": seed, "float64": float64, "seconds": seconds, "hunks": trees["hunks"],
                  "supplied": runs["original"]["meta"].get("supplied", []),
                  "versions": {"original": {k: runs["original"]["meta"].get(k) for k in ("torch", "torch_xla")},
                               "migrated": {"torch": runs["migrated"]["meta"].get("torch")}},
                  "world_size": 1}
        for name in ("original", "migrated"):
            meta = runs[name]["meta"]
            if meta.get("status") == "error" and not meta.get("steps"):
                hint = ""
                if name == "original" and sides[name]["kind"] == "xla":
                    hint = (f" (under torch_xla {meta.get('torch_xla')} as it is: a program written for an older torch_xla "
                            "needs one, with its own torch, through --xla-python)")
                raise CannotRun(f"the {name} program failed before its first optimizer step{hint}:\n"
                                f"{meta.get('error') or runs[name]['stderr']}")
            result[f"{name}_status"] = meta.get("status")
            if meta.get("error"):
                result[f"{name}_error"] = meta["error"]
        if check_determinism:
            log("running the original program again (determinism check)")
            again = run_side(sides["original"], script, args, work / "original-again", **common)
            seconds["original_again"] = again["seconds"]
            from neuron_migrate.verify.compare import compare_runs

            det = compare_runs(runs["original"]["meta"], load_data(runs["original"]["data_path"]),
                               again["meta"], load_data(again["data_path"]), mode="float64")
            result["deterministic"] = det["first"] is None
            if det["first"] is not None:
                result.update(verdict="not-deterministic", comparison=det)
                return result
        from neuron_migrate.verify.compare import compare_runs, localise_module

        data = {n: load_data(runs[n]["data_path"]) for n in runs}
        cmp = compare_runs(runs["original"]["meta"], data["original"], runs["migrated"]["meta"], data["migrated"])
        result["comparison"] = cmp
        first = cmp["first"]
        if first is None and nproc > 1:
            log(f"running the migrated program under torchrun with {nproc} processes for {steps} steps")
            multi = run_side(sides["migrated"], script, args, work / f"migrated-{nproc}", **common, nproc=nproc)
            seconds[f"migrated_{nproc}_processes"] = multi["seconds"]
            from neuron_migrate.verify.compare import compare_collectives, compare_ranks, compare_with_one_process

            metas = [r["meta"] for r in multi["ranks"]]
            datas = [load_data(r["data_path"]) for r in multi["ranks"]]
            dist = compare_ranks(metas, datas, nproc, cmp["mode"])
            dist["collectives"] = compare_collectives(runs["original"]["meta"], metas[0], dist["steps"], nproc)
            dist["trajectory"] = compare_with_one_process(runs["migrated"]["meta"], data["migrated"], metas, datas,
                                                          nproc, cmp["mode"])
            result["distributed"] = dist
            found = [f for f in (dist["first"], dist["collectives"]["first"], dist["trajectory"].get("first")) if f]
            if found:
                first = min(found, key=lambda f: f["step"])  # the earliest; at one step in the order above
                dist["ok"] = False
                cmp["first"] = first
                result.update(verdict="diverged",
                              where=_where_collective(first, runs["original"]["meta"], Path(trees["original"]),
                                                      metas[0], migrated, trees["hunks"]))
                return result
        if first is None:
            result["verdict"] = "equivalent" if cmp["steps"] > 0 else "no-steps"
            return result
        result["verdict"] = "diverged"
        where: dict = {}
        if first["what"] == "mode":  # the modes name the module; no replay needed
            result["where"] = _where_mode(first, {n: runs[n]["meta"] for n in runs}, trees, trees["hunks"])
            return result
        if first["what"] in ("param", "hparams"):
            where = _where_optimizer(runs["migrated"]["meta"], migrated, trees["hunks"])
        if localise and first["what"] in ("loss", "grad", "param") and first["step"] is not None:
            step = first["step"]
            log(f"replaying step {step} on both sides with module hooks")
            replay = {}
            for name in ("original", "migrated"):
                r = run_side(sides[name], script, args, work / f"{name}-replay", steps=step + 1, seed=seed,
                             float64=float64, timeout=timeout, hook_step=step)
                replay[name] = (r["meta"], load_data(r["data_path"]))
                seconds[f"{name}_replay"] = r["seconds"]
            found = localise_module(*replay["original"], *replay["migrated"], cmp["mode"])
            if found:
                where = {**_where_module(found, migrated, trees["hunks"]), **({"optimizer_site": where} if where else {})}
        result["where"] = where
        return result
    finally:
        if keep is None:
            shutil.rmtree(work, ignore_errors=True)
