"""Line scans of one file for the repository model: what it imports, what it adds to `sys.path`, whether it is a
program (`if __name__ == "__main__":`) and what starts processes or a process group in it; of launchers, which
scripts they start and how; of packaging files, their console scripts.

Nothing is parsed: regular expressions run over the file's bytes (a few per file, in C), and only what they match
is looked at in Python. A scan can be wrong both ways on odd code (an `import` line inside a docstring); the model
that uses it only ever moves a decision to its conservative side (a module is treated as possibly distributed).
"""
from __future__ import annotations

import re

TYPE_CHECKING = False  # typing is not imported at run time (start-up): it serves annotations only
if TYPE_CHECKING:
    from typing import Optional

class _Lazy:
    """A pattern compiled when it is first used, which then takes its place among the module's globals: compiling
    the module's ~30 patterns costs ~3 ms, most of a one-file run's scan (a launcher's or packaging file's patterns are
    never needed there)."""

    __slots__ = ("args",)

    def __init__(self, *args):
        self.args = args

    def __getattr__(self, name: str):
        compiled = re.compile(*self.args)
        module = globals()
        for key, value in list(module.items()):
            if value is self:
                module[key] = compiled
        return getattr(compiled, name)


# -- Python files -----------------------------------------------------------------------------------------------
# Regular expressions over a whole file cost ~20 ns a byte in Python's engine (one pass over a 190k-line tree: 0.15 s),
# `bytes.find` a small fraction of that: literals are found first, and a pattern only ever runs on the lines they
# are on.
_IMPORT = _Lazy(
    rb"[ \t]*(?:from[ \t]+(\.*)[ \t]*([\w.]*)[ \t]+import[ \t]*(\([^)]*\)|[^\n#;]*(?:\\\r?\n[^\n#;]*)*)"
    rb"|import[ \t]+([^\n#;]+))")
_DYNAMIC = _Lazy(rb"""\(\s*["']([\w.]+)["']""")  # after `import_module`
_MAIN = _Lazy(rb"""if[ \t(]+(?:__name__[ \t]*==[ \t]*["']__main__["']|["']__main__["'][ \t]*==[ \t]*__name__)""")
_TOP_LEVEL = _Lazy(rb"^(?=[^\s#])(?!else\b|elif\b|except\b|finally\b)", re.M)
# a loop header at column 0 (`for batch in loader:`, `while step < n:`): code a script runs at module level; prose in a
# docstring seldom has the statement's shape (the rule that reads the flag checks the tree again)
_TOP_LOOP = _Lazy(rb"^(?:(?:async[ \t]+)?for[ \t][^\n]*[ \t]in[ \t][^\n]*|while[ \t][^\n]*):[ \t]*(?:#[^\n]*)?\r?$", re.M)
_SYS_PATH = _Lazy(rb"\bsys\.path\.(?:append|insert|extend)[ \t]*\(")
_PATH_ASSIGN = _Lazy(rb"^[ \t]*([A-Za-z_]\w*)[ \t]*(?::[^=\n]*)?=[ \t]*([^\n]*(?:__file__|argv\[0\]|dirname|\.parent)[^\n]*)$", re.M)
_CLASS = _Lazy(rb"class[ \t]+(\w+)[ \t]*(?:\(([^)]*)\))?[ \t]*:")
# what starts processes or a process group (the modes a program can have besides "single"), by the literals that
# show it
# (DDP and FSDP by the names they are imported by: `DDP(` would be a slow needle; a file that calls it imports it)
_ENV = tuple(q + v + q for v in (b"RANK", b"LOCAL_RANK", b"WORLD_SIZE", b"LOCAL_WORLD_SIZE", b"GROUP_RANK")
             for q in (b"'", b'"'))
# attributes (`cfg.backend`, `args.dist_backend`, `self.device`) read where torch takes a process-group backend or a
# device: a config field or command-line default of that name in another file is then a backend/device value
_SINK_NEEDLES = (b"init_process_group(", b"new_group(", b"is_backend_available(", b"device(", b"device=", b"backend=",
                 b"device_type=", b"map_location=", b".to(", b"autocast(")
_SINK_ATTR = _Lazy(
    r"(?:\b(?:backend|device|device_type|map_location)[ \t]*=[ \t]*"
    r"|(?:\binit_process_group|\bnew_group|\bis_backend_available|\btorch\.device|\.to|\bautocast)\([ \t]*)"
    r"(?:str\()?((?:[A-Za-z_]\w*\.)*)([A-Za-z_]\w*)\b(?![ \t]*[(.\[=])")
_ATTR_ASSIGN = _Lazy(r"^[ \t]*([A-Za-z_]\w*)[ \t]*=[ \t]*(?:[A-Za-z_]\w*\.)+([A-Za-z_]\w*)[ \t]*(?:#.*)?$")
# config values that name a backend or a device: a class field or module global (`backend: str = "nccl"`) and a
# command-line default (`parser.add_argument("--dist-backend", default="nccl")`)
_VALUE_WORDS = (b"nccl", b"gloo", b"cuda", b"xla", b"mps", b"xpu")
_FIELD = _Lazy(r"""^[ \t]*([A-Za-z_]\w*)[ \t]*(?::[^=\n]*)?=[ \t]*(?:field\([ \t]*default[ \t]*=[ \t]*)?["'](?:nccl|gloo|cuda|xla|mps|xpu)(?::\d+)?["']""")
_OPTION = _Lazy(r"""add_argument\(\s*["']-?-?([\w-]+)["']""")
_DEST = _Lazy(r"""\bdest[ \t]*=[ \t]*["'](\w+)["']""")
_TRAIN_CALL = _Lazy(r"\.(zero_grad|backward|step)\(|\b(optimizer_step)\(")
_DEF = _Lazy(r"^([ \t]*)(?:async[ \t]+)?(def|class)[ \t]+(\w+)")
# nanoGPT's configuration: `exec(open('configurator.py').read())` runs a file in the program's globals, and the
# configurator itself runs `exec(open(config_file).read())` on the files named on the command line
_EXEC = _Lazy(rb"""\bexec\([ \t]*open\([ \t]*(?:["']([^"'\n]+)["']|[A-Za-z_][\w.]*)[ \t]*\)\.read\(\)""")
_TOP_ASSIGN = _Lazy(rb"^([A-Za-z_]\w*)[ \t]*(?::[^=\n]*)?=(?!=)", re.M)
_CONFIG_OTHER = _Lazy(rb"^(?:import[ \t]|from[ \t]|[)\]}]|[rbuRBU]?[\"'])")


def _positions(data: bytes, needle: bytes) -> list:
    out = []
    i = data.find(needle)
    while i >= 0:
        out.append(i)
        i = data.find(needle, i + 1)
    return out


def _line_starts(data: bytes, needle: bytes) -> list:
    """The start of every line that holds `needle` (once per line)."""
    out = []
    i = data.find(needle)
    while i >= 0:
        start = data.rfind(b"\n", 0, i) + 1
        if not out or out[-1] != start:
            out.append(start)
        end = data.find(b"\n", i)
        if end < 0:
            break
        i = data.find(needle, end)
    return out


class _Lines:
    """Line numbers of byte offsets asked in increasing order (each count starts where the last ended: a file with
    many hits is not counted from its start for each)."""

    __slots__ = ("data", "at", "line")

    def __init__(self, data: bytes):
        self.data, self.at, self.line = data, 0, 1

    def of(self, pos: int) -> int:
        if pos < self.at:
            self.at, self.line = 0, 1
        self.line += self.data.count(b"\n", self.at, pos)
        self.at = pos
        return self.line


def _names(text: str) -> list:
    """`a, b as c` (or the same in brackets) -> [(a, a), (b, c)]: (imported name, local name)."""
    text = text.strip()
    if text.isidentifier():  # most imports: one plain name
        return [[text, text]]
    out = []
    for part in text.strip().strip("()").replace("\\\n", " ").split(","):
        bits = part.split()
        if not bits:
            continue
        name = bits[0]
        local = bits[2] if len(bits) >= 3 and bits[1] == "as" else name
        out.append([name, local])
    return out


def _call_argument(data: bytes, start: int) -> bytes:
    """The text between the bracket that opens at `start - 1` and the one that closes it."""
    depth = 1
    i = start
    n = len(data)
    while i < n and depth:
        c = data[i]
        if c == 40:  # (
            depth += 1
        elif c == 41:  # )
            depth -= 1
        i += 1
    return data[start:i - 1]


def _folder_of(expr: str, known: dict) -> Optional[list]:
    """A folder expression relative to this file's folder, as [levels up, sub path], or None when it is not one
    this scan can follow: `os.path.dirname(os.path.abspath(__file__))` -> [0, ""], two dirnames -> [1, ""],
    `Path(__file__).resolve().parents[1]` -> [1, ""], `os.path.join(HERE, "..", "src")` -> [1, "src"] (HERE a
    name assigned from such an expression), `sys.argv[0]` as `__file__` (a script's own path)."""
    if "__file__" in expr or "argv[0]" in expr:
        up = -1  # __file__ itself: the first dirname/parent gives the folder
    else:
        names = [n for n in re.findall(r"[A-Za-z_]\w*", expr) if n in known]
        if not names:
            return None
        up, sub = known[names[0]]
        if sub:
            return None  # a folder below this one, then walked up again: not followed
    up += expr.count("dirname(") + len(re.findall(r"\.parent\b(?!s)", expr))
    m = re.search(r"\.parents\[(\d+)\]", expr)
    if m:
        up += int(m.group(1)) + 1
    sub = []
    for part in re.findall(r"""["']([^"']*)["']""", expr):
        for piece in part.replace("\\", "/").split("/"):
            if piece in ("", "."):
                continue
            if piece == "..":
                if sub:
                    sub.pop()
                else:
                    up += 1
            else:
                sub.append(piece)
    if up < 0:
        return None
    return [up, "/".join(sub)]


def scan_python(data: bytes) -> dict:
    """The record of one Python file (plain data, stored in the model's cache):

    - "i": imports, [level, module, [[name, local name], ...]] for `from`, [0, module, None] for `import module`
      and [0, module, None, alias] for `import module as alias`,
    - "d": modules imported by `importlib.import_module("literal")`,
    - "p": folders added to `sys.path`, [[levels up from this file's folder, sub path]],
    - "m": 1 when the file has an `if __name__ == "__main__":` guard,
    - "s": what starts processes or a group outside that guard, "ms": inside it only (see _signals),
    - "c": top-level classes and their bases' text, {name: [base, ...]} (what NM406 follows across files),
    - "t": 1 when some line calls zero_grad/backward/step (training_defs reads which def does),
    - "k": 1 when the file calls something named `compile(`,
    - "v": fields, globals and command-line options whose default names a backend or a device, {name: line},
    - "rt": 1 when the file names `RateTracker` (NM144 gives every tracker of a repository the same form),
    - "ml": 1 when the file names `MpDeviceLoader` or `per_device_loader` (NM130 follows its loaders: flows.py),
    - "x": the files it runs with `exec(open("literal").read())`, "*" for a file named by a variable (nanoGPT's
      configurator runs the config files of the command line so),
    - "cf": the names a file of top-level assignments only assigns (a config file such a configurator may run),
    - "tl": 1 when a loop starts at column 0 (a script without a `__main__` guard runs its training loop there),
    - "dp": 1 when the file asks whether CUDA and another accelerator (mps, xpu) are available: it may pick the device
      among them (NM203 gives such a picker its neuron branch, and the CUDA tests of other files stay: NM201).
    """
    rec: dict = {}
    imports = []
    i = data.find(b"import")
    while i >= 0:
        start = data.rfind(b"\n", 0, i) + 1
        m = _IMPORT.match(data, start)
        if m is None or m.end() <= i:
            i = data.find(b"import", i + 6)
            continue
        i = data.find(b"import", m.end())
        try:
            if m.group(4) is not None:
                for name, local in _names(m.group(4).decode()):
                    imports.append([0, name, None] if local == name else [0, name, None, local])
            else:
                imports.append([len(m.group(1)), m.group(2).decode(), _names(m.group(3).decode())])
        except UnicodeDecodeError:
            continue
    if imports:
        rec["i"] = imports
    dynamic = []
    for needle in (b"import_module(",):
        for i in _positions(data, needle):
            m = _DYNAMIC.match(data, i + len(needle) - 1)
            if m:
                dynamic.append(m.group(1).decode("utf-8", "replace"))
    if dynamic:
        rec["d"] = dynamic
    if b"sys.path" in data:
        paths = _sys_paths(data)
        if paths:
            rec["p"] = paths
    guard = None
    for start in _line_starts(data, b"__main__"):
        if _MAIN.match(data, start):
            rec["m"] = 1
            after = data.find(b"\n", start)
            end = _TOP_LEVEL.search(data, after + 1) if after >= 0 else None
            guard = (start, end.start() if end else len(data))
            break
    outside, inside = [], []
    for name, hits in _signals(data, imports):
        if not hits:
            continue
        if guard is not None and all(guard[0] <= h < guard[1] for h in hits):
            inside.append(name)
        else:
            outside.append(name)
    if outside:
        rec["s"] = outside
    if inside:
        rec["ms"] = inside
    classes = {}
    for start in ([0] if data.startswith(b"class") else []) + [i + 1 for i in _positions(data, b"\nclass")]:
        m = _CLASS.match(data, start)
        if m is None:
            continue
        try:
            bases = [b.strip() for b in (m.group(2) or b"").decode().split(",")]
        except UnicodeDecodeError:
            continue
        classes[m.group(1).decode()] = [b for b in bases if b and "=" not in b]
    if classes:
        rec["c"] = classes
    if b"backward(" in data or b"zero_grad(" in data:  # a training step has one of them
        rec["t"] = 1
    if b"compile(" in data:
        rec["k"] = 1
    values = _value_attrs(data)
    if values:
        rec["v"] = values
    if b"RateTracker" in data:
        rec["rt"] = 1
    if b"MpDeviceLoader" in data or b"per_device_loader" in data:
        rec["ml"] = 1
    if b"exec(" in data:
        ran = [m.group(1).decode("utf-8", "replace") if m.group(1) else "*" for m in _EXEC.finditer(data)]
        if ran:
            rec["x"] = ran
    names = config_names(data)
    if names:
        rec["cf"] = names
    if (b"for " in data or b"while " in data) and _TOP_LOOP.search(data):
        rec["tl"] = 1
    if b"cuda.is_available" in data and (b"mps.is_available" in data or b"xpu.is_available" in data):
        rec["dp"] = 1
    return rec


def config_names(data: bytes) -> list:
    """The names a file of top-level assignments assigns ([]: the file holds something else: a def, a class, a
    statement, a guard). Comments, imports, docstrings and the lines of a bracket continued at column 0 may sit
    between them (`wandb_run_name = 'gpt2-' + str(time.time())` after `import time`)."""
    if b"def " in data or b"class " in data or b"__main__" in data or b"exec(" in data:
        return []
    names: list = []
    depth = 0
    doc = False
    for line in data.splitlines():
        quotes = line.count(b'"""') + line.count(b"'''")
        if doc or quotes % 2:
            doc = doc != bool(quotes % 2)
            if doc or not quotes:
                continue
        if depth <= 0 and line[:1] not in (b"", b" ", b"\t", b"#", b"\r"):
            m = _TOP_ASSIGN.match(line)
            if m:
                name = m.group(1).decode()
                if name not in names:
                    names.append(name)
            elif not _CONFIG_OTHER.match(line):
                return []
            depth = 0
        depth += line.count(b"(") + line.count(b"[") + line.count(b"{") - line.count(b")") - line.count(b"]") - line.count(b"}")
    return names


def top_names(data: bytes) -> dict:
    """{name: line} of the names a file assigns at column 0 (its module globals, as a configurator overrides them)."""
    out: dict = {}
    lines = _Lines(data)
    for m in _TOP_ASSIGN.finditer(data):
        out.setdefault(m.group(1).decode(), lines.of(m.start()))
    return out


_LAST_SINK_STARTS: list = [None, []]  # (data, its `_sink_starts`): sink_names and _sink_attrs read the same file in turn


def _sink_starts(data: bytes) -> list:
    """The starts of the lines that hold one of `_SINK_NEEDLES`, in order."""
    if _LAST_SINK_STARTS[0] is not data:
        _LAST_SINK_STARTS[:] = [data, sorted({s for needle in _SINK_NEEDLES for s in _line_starts(data, needle)})]
    return _LAST_SINK_STARTS[1]


def sink_names(data: bytes) -> dict:
    """{name: first line} of the plain names (not attributes) a backend or device position reads: `backend=backend`,
    `.to(device)`, `torch.device(device)` (what a config file's global of that name becomes in the program)."""
    out: dict = {}
    lines = _Lines(data)
    for start in _sink_starts(data):
        end = data.find(b"\n", start)
        line = data[start:end if end >= 0 else len(data)].decode("utf-8", "replace")
        if line.lstrip().startswith("#"):
            continue
        for m in _SINK_ATTR.finditer(line):
            if not m.group(1):
                out.setdefault(m.group(2), lines.of(start))
    return out


def _value_attrs(data: bytes) -> dict:
    """{name: line} of fields, globals and command-line options whose default names a backend or a device."""
    starts = sorted({s for word in _VALUE_WORDS for s in _line_starts(data, word)})
    out: dict = {}
    lines = _Lines(data)
    for start in starts:
        end = data.find(b"\n", start)
        line = data[start:end if end >= 0 else len(data)].decode("utf-8", "replace")
        m = _FIELD.match(line)
        name = m.group(1) if m and m.group(1) != "default" else None
        if name is None and "default" in line:
            opt = _OPTION.search(line)
            if opt is None:  # the option's name on a line above (a call over several lines)
                before = data.rfind(b"add_argument(", max(0, start - 400), start)
                opt = _OPTION.search(data[before:start].decode("utf-8", "replace")) if before >= 0 else None
            if opt is not None:
                dest = _DEST.search(line)
                name = dest.group(1) if dest else opt.group(1).replace("-", "_")
        if name is not None:
            out.setdefault(name, lines.of(start))
    return out


def _sink_attrs(data: bytes) -> dict:
    """{attribute name: first line} of the attributes a backend or device position reads (see `_SINK_ATTR`). A scan,
    not a parse: a name it finds that is no config value changes nothing (the model only marks value sets of that
    name as reaching torch, which the other file's own strings then decide)."""
    starts = _sink_starts(data)
    if not starts:
        return {}
    out: dict = {}
    names: dict = {}  # plain names in sink positions -> line
    lines = _Lines(data)
    for start in starts:
        end = data.find(b"\n", start)
        line = data[start:end if end >= 0 else len(data)].decode("utf-8", "replace")
        if line.lstrip().startswith("#"):
            continue
        lineno = lines.of(start)
        for m in _SINK_ATTR.finditer(line):
            if m.group(1) == "torch.":
                continue  # torch.float32, torch.device: not a value of the program's
            if m.group(1):
                out.setdefault(m.group(2), lineno)
            else:
                names.setdefault(m.group(2), lineno)
    if names:
        for line in data.decode("utf-8", "replace").splitlines():
            if "=" in line and "." in line:
                m = _ATTR_ASSIGN.match(line)
                if m and m.group(1) in names:
                    out.setdefault(m.group(2), names[m.group(1)])
    return out


# a def's signature, matched at the start of each line that holds `def` (the pattern is not run over the whole file)
_SIGNATURE = _Lazy(rb"[ \t]*(?:async[ \t]+)?def[ \t]+(\w+)[ \t]*\(")
_PARAM = _Lazy(r"^\*{0,2}([A-Za-z_]\w*)")
_ATTR_ARG = _Lazy(r"^(?:[A-Za-z_]\w*\.)+([A-Za-z_]\w*)$")


def _split_args(text: str) -> list:
    """The top-level comma-separated pieces of an argument or parameter list."""
    out, depth, cur = [], 0, []
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur).strip())
    return out


def sink_params(data: bytes) -> dict:
    """{function: [[position, parameter]]} of the functions of a file whose parameter a backend or device position
    reads as a plain name (`def setup(backend): dist.init_process_group(backend=backend)`): a caller's argument in
    that position is a backend or device value (`setup(cfg.dist_backend)` in another file). A method's position
    counts without `self`."""
    names = sink_names(data)
    if not names:
        return {}
    import bisect

    starts, found = [], []  # each def's line, and its match
    lines = _Lines(data)
    for m in (_SIGNATURE.match(data, start) for start in _line_starts(data, b"def")):
        if m is None:
            continue
        starts.append(lines.of(m.start()))
        found.append(m)
    params_of: dict = {}  # def index -> its parameters, parsed for the defs that own a name only

    def params(k: int) -> list:
        got = params_of.get(k)
        if got is None:
            m = found[k]
            got = []
            for piece in _split_args(_call_argument(data, m.end()).decode("utf-8", "replace")):
                pm = _PARAM.match(piece)
                if pm and not piece.startswith("*"):
                    got.append(pm.group(1))
            if got and got[0] in ("self", "cls"):
                got = got[1:]
            params_of[k] = got
        return got

    out: dict = {}
    for name, line in names.items():
        k = bisect.bisect_right(starts, line) - 1  # the nearest def above the line (a scan: nesting is not followed)
        if k < 0:
            continue
        owner = params(k)
        if name in owner:
            out.setdefault(found[k].group(1).decode(), []).append([owner.index(name), name])
    return out


def call_attrs(data: bytes, params: dict) -> dict:
    """{attribute: line} of the attributes this file passes to the functions of `params` (`sink_params` of other
    files) in a position or under a keyword whose parameter reaches torch: `setup_distributed(cfg.dist_backend)`."""
    out: dict = {}
    for fn, spots in params.items():
        needle = fn.encode() + b"("
        for i in _positions(data, needle):
            if i and (data[i - 1:i].isalnum() or data[i - 1:i] in (b"_",)):
                continue
            line_start = data.rfind(b"\n", 0, i) + 1
            if data[line_start:i].lstrip().startswith(b"def "):
                continue
            args = _split_args(_call_argument(data, i + len(needle)).decode("utf-8", "replace"))
            for index, param in spots:
                picked = [a.split("=", 1)[1].strip() for a in args if re.match(rf"^{param}\s*=(?!=)", a)]
                if not picked and index < len(args) and "=" not in args[index].split("(")[0]:
                    picked = [args[index]]
                for arg in picked:
                    m = _ATTR_ARG.match(arg)
                    if m:
                        out.setdefault(m.group(1), data.count(b"\n", 0, i) + 1)
    return out


def _signals(data: bytes, imports: list) -> list:
    """[(mode, positions)]: where the file spawns processes or starts a process group. (Every `in` below is a pass over
    the file: rare needles gate the others.)"""
    spawn, mp = [], []
    if b"multiprocessing" in data:
        if b"xla_multiprocessing" in data:
            spawn = _positions(data, b"spawn(")
        mp = [i for n in (b"mp.spawn(", b"multiprocessing.spawn(", b"start_processes(") for i in _positions(data, n)
              if data[i - 1:i] != b"x" and data[i - 4:i] != b"xla_"]
    launch = _positions(data, b"torch_xla.launch(")
    if any(imp[1] == "torch_xla" and imp[2] and any(n == "launch" for n, _l in imp[2]) for imp in imports):
        launch += _positions(data, b"launch(")
    group = []
    if b"DataParallel" in data:  # DistributedDataParallel, FullyShardedDataParallel
        group += _positions(data, b"DistributedDataParallel") + _positions(data, b"FullyShardedDataParallel")
    # xr.use_spmd(): NM150 rewrites a single-controller SPMD program to one process per device, so the files it runs
    # may run in a process group (their guarded forms keep meaning in one process too)
    for needle in (b"init_process_group", b"fully_shard(", b"use_spmd("):
        group += _positions(data, needle)
    if b"RANK" in data or b"WORLD_SIZE" in data:
        group += [i for n in _ENV for i in _positions(data, n)]
    return [("xmp.spawn", spawn), ("torch_xla.launch", launch), ("mp.spawn", mp), ("process group", group)]


def _sys_paths(data: bytes) -> list:
    known: dict = {}
    for m in _PATH_ASSIGN.finditer(data):
        folder = _folder_of(m.group(2).decode("utf-8", "replace"), known)
        if folder is not None:
            known[m.group(1).decode()] = folder
    out = []
    for m in _SYS_PATH.finditer(data):
        arg = _call_argument(data, m.end()).decode("utf-8", "replace")
        if "insert" in m.group(0).decode():
            arg = arg.split(",", 1)[1] if "," in arg else ""
        for piece in re.split(r",(?![^(\[]*[)\]])", arg.strip().strip("[]")):
            piece = piece.strip()
            if not piece:
                continue
            folder = _folder_of(piece, known)
            if folder is None and re.fullmatch(r"str\((.*)\)", piece):
                folder = _folder_of(piece[4:-1], known)
            if folder is not None and folder not in out:
                out.append(folder)
    return out


def training_defs(data: bytes) -> dict:
    """{"func" / "Class.method": training calls} for top-level defs and methods of top-level classes (a nested def's
    calls count for the def that holds it, as a walk of that def's tree would find them)."""
    out: dict = {}
    stack: list = []  # (indent, kind, name)
    for line in data.decode("utf-8", "replace").splitlines():
        stripped = line.lstrip()
        if not stripped or stripped.startswith("#"):
            continue
        indent = len(line) - len(stripped)
        while stack and indent <= stack[-1][0]:
            stack.pop()
        m = _DEF.match(line)
        if m:
            stack.append((indent, m.group(2), m.group(3)))
            continue
        if ".zero_grad(" not in line and ".backward(" not in line and ".step(" not in line and "optimizer_step(" not in line:
            continue
        key = None
        if stack and stack[0][1] == "def" and stack[0][0] == 0:
            key = stack[0][2]
        elif len(stack) >= 2 and stack[0][1] == "class" and stack[0][0] == 0 and stack[1][1] == "def":
            key = f"{stack[0][2]}.{stack[1][2]}"
        if key is None:
            continue
        calls = out.setdefault(key, [])
        for c in _TRAIN_CALL.finditer(line):
            name = "step" if c.group(2) else c.group(1)
            if name not in calls:
                calls.append(name)
    return out


_SELF_ATTR = _Lazy(r"\bself\.(\w+)")
_SELF_ASSIGN = _Lazy(r"self\.(\w+)[ \t]*=(?!=)[ \t]*(.*)", re.S)
_OPTIMIZER = _Lazy(r"self\.(\w+)[ \t]*=[ \t]*[\w.]+\(\s*self\.(\w+)\.parameters\(\s*\)", re.S)
_SELF_CALL = _Lazy(r"\bself\.(\w+)[ \t]*\(|\bgetattr\([ \t]*self\b|\bvars\([ \t]*self\b|[(,][ \t]*self[ \t]*[,)]")


def class_inits(data: bytes) -> dict:
    """What the `__init__` of each top-level class does with the attributes it sets, for NM150's data-parallel
    rewrite of a subclass in another file (pytorch/xla's train_resnet_spmd_data_parallel.py: the base class builds
    `self.model` and `self.optimizer = optim.SGD(self.model.parameters(), ...)`):
    {Class: {"o": [[optimizer attribute, model attribute, line]] (an attribute assigned a call whose first argument
    is `self.<model>.parameters()`), "a": {attribute: [line, assigned text]} (the last assignment of each),
    "r": [[attribute, line]] (every other statement that reads `self.<attribute>`), "c": [line, ...] (statements
    that call a method of self, or hand `self` on: code a subclass may override runs there)}}. Statements are joined across brackets; a string or comment holding such text reads as a use (which
    only ever blocks the rewrite)."""
    out: dict = {}
    lines = data.decode("utf-8", "replace").splitlines()
    cls = None
    init_indent = None
    stmt, start, depth = "", 0, 0
    statements: list = []  # (class, first line, text)
    for no, line in enumerate(lines, 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        indent = len(line) - len(line.lstrip())
        if depth == 0 and not stmt:
            if indent == 0:
                m = _DEF.match(line)
                cls = m.group(3) if m and m.group(2) == "class" else None
                init_indent = None
                continue
            if cls is not None and init_indent is not None and indent <= init_indent:
                init_indent = None
            if cls is not None and init_indent is None:
                m = _DEF.match(line)
                if m and m.group(2) == "def" and m.group(3) == "__init__":
                    init_indent = indent
                continue
            if init_indent is None:
                continue
            start = no
        stmt += line.split("#", 1)[0] if "'" not in line and '"' not in line else line
        stmt += "\n"
        depth = max(0, depth + sum(line.count(o) - line.count(c) for o, c in (("(", ")"), ("[", "]"), ("{", "}"))))
        if depth == 0 and not line.rstrip().endswith("\\"):
            statements.append((cls, start, stmt.strip()))
            stmt = ""
    for name, no, text in statements:
        rec = out.setdefault(name, {"o": [], "a": {}, "r": [], "c": []})
        if _SELF_CALL.search(text.replace("super().__init__(", "")):
            rec["c"].append(no)
        opt = _OPTIMIZER.match(text)
        if opt:
            rec["o"].append([opt.group(1), opt.group(2), no])
        assign = _SELF_ASSIGN.match(text)
        reads = [m.group(1) for m in _SELF_ATTR.finditer(text)]
        if assign:
            rec["a"][assign.group(1)] = [no, assign.group(2).strip()]
            reads = reads[1:]
        for attr in dict.fromkeys(reads):
            rec["r"].append([attr, no])
    return out


# -- launchers, job files, packaging ---------------------------------------------------------------------------
_TORCHRUN = _Lazy(r"\btorchrun\b|torch\.distributed\.(?:run|launch)\b|\baccelerate[ \t]+launch\b")
_SCRIPT = _Lazy(r"""(?:^|[\s"'=/])((?:[\w.${}-]+/)*[\w-]+\.py)\b""")
_MODULE = _Lazy(r"\bpython[\d.]*[ \t]+(?:-\w+[ \t]+)*-m[ \t]+([\w.]+)")


def scan_launcher(data: bytes) -> list:
    """[[script or module, how]] for each Python program a launcher or job file starts: how is "torchrun" (torchrun,
    `python -m torch.distributed.run`/`launch`, `accelerate launch`) or "python"; a module is written `-m pkg.mod`."""
    text = data.decode("utf-8", "replace").replace("\\\r\n", " ").replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        if ".py" not in line and "-m" not in line:
            continue
        how = "torchrun" if _TORCHRUN.search(line) else "python"
        for m in _SCRIPT.finditer(line):
            path = re.sub(r"^(?:\$\{?\w+\}?/)+", "", m.group(1))
            out.append([path, how])
        for m in _MODULE.finditer(line):
            mod = m.group(1)
            if not mod.startswith("torch.distributed"):
                out.append(["-m " + mod, how])
    return out


_ENTRY = _Lazy(r"""["']?[\w.-]+["']?[ \t]*=[ \t]*["']?[ \t]*([A-Za-z_][\w.]*)[ \t]*:[ \t]*[A-Za-z_][\w.]*""")
_SECTION = _Lazy(r"^\[([^\]]+)\]", re.M)


def scan_packaging(name: str, data: bytes) -> list:
    """Modules that console scripts (or GUI scripts) of pyproject.toml, setup.py or setup.cfg start."""
    text = data.decode("utf-8", "replace")
    if name == "pyproject.toml":
        found = []
        parts = _SECTION.split(text)
        for head, body in zip(parts[1::2], parts[2::2]):
            if head.strip() in ("project.scripts", "project.gui-scripts", "tool.poetry.scripts"):
                found += [m.group(1) for m in _ENTRY.finditer(body)]
        return found
    if "console_scripts" not in text and "gui_scripts" not in text:
        return []
    start = min(i for i in (text.find("console_scripts"), text.find("gui_scripts")) if i >= 0)
    return [m.group(1) for m in _ENTRY.finditer(text, start)]
