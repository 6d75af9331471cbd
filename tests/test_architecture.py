"""Architecture rules checked over the source (docs/architecture.md gives the layers).

No import cycles; imports point down the layers; the pure layers (format, keys,
codecs, metadata) do no I/O; error classes only in the error modules; no
``__getattr__`` delegation.

The import graph covers ``shardkv`` and ``transformers`` (installed as
``shardkv.transformers``) and counts every import statement, at module level
or inside a function, so a cycle hidden behind a function-level import fails
too. Importing a submodule is not counted as importing its parent package.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"shardkv": ROOT / "shardkv", "shardkv.transformers": ROOT / "transformers"}
# Error classes defined outside shardkv/errors.py, pending the owners' edits; do not add to it.
ERRORS_ELSEWHERE_ALLOWED: set[tuple[str, str]] = set()


# The layers, bottom first: a module may import its own layer and the layers below it, never above.
LAYERS: list[set[str]] = [
    {"_version", "_types", "errors"},
    {"format"},
    {"keys", "codecs"},
    {"metadata"},
    {"storage"},
    {"engine"},
    {"transformers"},
    {"proxy", "zarr3"},
    {"rechunk"},
    {"cli"},
    {"", "__main__"},  # the package's __init__ (public names) and ``python -m shardkv``
]
PURE = {"format", "keys", "codecs", "metadata"}
# What a pure module may not import or call: file systems, object stores, processes, the network.
IO_MODULES = {
    "fsspec",
    "s3fs",
    "obstore",
    "boto3",
    "botocore",
    "aiobotocore",
    "socket",
    "shutil",
    "tempfile",
    "subprocess",
    "urllib",
    "http",
    "requests",
    "sqlite3",
    "mmap",
    "fcntl",
    "glob",
    "pathlib",
}
OS_CALLS = {
    "open",
    "read",
    "write",
    "pread",
    "pwrite",
    "writev",
    "listdir",
    "scandir",
    "stat",
    "lstat",
    "fstat",
    "remove",
    "unlink",
    "rename",
    "replace",
    "makedirs",
    "mkdir",
    "rmdir",
    "walk",
    "fsync",
    "system",
    "popen",
    "fork",
    "kill",
}  # as os.<name>
IO_METHODS = {
    "read_text",
    "read_bytes",
    "write_text",
    "write_bytes",
    "iterdir",
    "scandir",
    "listdir",
    "fsync",
    "pread",
    "pwrite",
    "makedirs",
    "unlink",
    "mkdir",
    "rmdir",
}  # on any object


def _layer_of(module: str) -> str:
    """The layer name of a module: ``shardkv.engine.reads`` -> ``engine``; the transformers are ``transformers``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _rank(layer: str) -> int:
    for i, members in enumerate(LAYERS):
        if layer in members:
            return i
    raise KeyError(f"layer {layer!r} is in no entry of LAYERS: add it where it belongs")


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([package, *parts])] = path
    return out


MODULES = _modules()


def _is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def _imports(module: str) -> set[str]:
    """The in-project modules ``module`` imports (any depth in the file)."""
    tree = ast.parse(MODULES[module].read_text(), str(MODULES[module]))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module if _is_package(module) else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return {name for name in found if name in MODULES and name != module}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_the_graph_sees_the_packages() -> None:
    graph = {m: _imports(m) for m in MODULES}
    assert "shardkv.proxy.store" in graph and "shardkv.transformers.sharding" in graph
    assert "shardkv.errors" in graph["shardkv.proxy.store"]
    assert "shardkv.transformers" in graph["shardkv.proxy.draft"]


def test_cycle_finder_finds_function_level_cycles() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    graph = {m: _imports(m) for m in MODULES}
    assert _cycles(graph) == []


def test_error_classes_live_in_errors_module() -> None:
    elsewhere = set()
    for module, path in MODULES.items():
        if module in ("shardkv.errors", "shardkv.cli.errors"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Error"):
                elsewhere.add((module, node.name))
    assert elsewhere == ERRORS_ELSEWHERE_ALLOWED


def test_imports_point_down_the_layers() -> None:
    upward = sorted(
        (module, target)
        for module in MODULES
        for target in _imports(module)
        if _rank(_layer_of(target)) > _rank(_layer_of(module))
    )
    assert upward == []


def test_the_layer_check_sees_an_upward_import() -> None:
    assert _rank(_layer_of("shardkv.format.layout")) < _rank(_layer_of("shardkv.proxy.store"))
    assert _rank(_layer_of("shardkv.storage.local")) < _rank(_layer_of("shardkv.engine.reads"))
    assert _rank(_layer_of("shardkv.transformers.sharding")) < _rank(_layer_of("shardkv.proxy.draft"))


def _io_in(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] in IO_MODULES]
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] in IO_MODULES:
            found.append(node.module or "")
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id == "open":
                found.append("open()")
            elif isinstance(f, ast.Attribute) and (
                f.attr in IO_METHODS or (f.attr in OS_CALLS and ast.unparse(f.value) in ("os", "os.path"))
            ):
                found.append(f"{ast.unparse(f)}()")
    return found


def test_pure_layers_do_no_io() -> None:
    found = {}
    for module, path in MODULES.items():
        if _layer_of(module) in PURE:
            io = _io_in(ast.parse(path.read_text()))
            if io:
                found[module] = io
    assert found == {}


def test_the_io_check_sees_io() -> None:
    found = _io_in(ast.parse("import fsspec\nopen('x')\nos.listdir('.')\npath.read_bytes()"))
    assert sorted(found) == ["fsspec", "open()", "os.listdir()", "path.read_bytes()"]
    assert _io_in(ast.parse("np.frombuffer(b, 'u8')\njson.loads(s)\ntext.replace('a', 'b')\nos.environ.get('X')")) == []


def test_no_getattr_delegation() -> None:
    """Wrappers name what they pass on: no ``__getattr__`` (module or class) forwarding unknown names.

    The package's own ``__getattr__`` imports its public names on first use from a table naming
    each (``shardkv._LAZY``; ``tests/test_import_cost.py`` checks it forwards nothing else).
    """
    trees = {module: ast.parse(path.read_text()) for module, path in MODULES.items()}
    lazy_table = {id(node) for node in trees["shardkv"].body if isinstance(node, ast.FunctionDef)}
    found = sorted(
        (module, node.lineno)
        for module, tree in trees.items()
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.name == "__getattr__"
        and id(node) not in lazy_table
    )
    assert found == []


def test_every_error_class_is_public_subclasses_a_builtin_and_is_listed_in_the_readme() -> None:
    import shardkv
    import shardkv.errors as errors

    classes = {name: obj for name, obj in vars(errors).items() if isinstance(obj, type) and issubclass(obj, Exception)}
    readme = (ROOT / "README.md").read_text()
    assert len(classes) <= 15  # a small set, one per way a caller reacts
    for name, cls in classes.items():
        assert getattr(shardkv, name) is cls, f"{name} is not importable from shardkv"
        assert name in shardkv.__all__
        if cls is not errors.ShardKVError:
            assert f"| `{name}` |" in readme, f"{name} is not in the README's error table"
            builtins = [
                b for b in cls.__mro__ if b.__module__ == "builtins" and b not in (Exception, BaseException, object)
            ]
            builtins += [b for b in cls.__mro__ if b.__module__ == "_pickle"]
            assert builtins, f"{name} subclasses no builtin a caller would catch"


FRAME_NAMES = {"_getframe", "currentframe", "f_lasti", "f_back", "stack"}
"""Names that read the interpreter's call stack (``sys._getframe``, ``inspect.currentframe``/``stack``, a frame's
``f_lasti``/``f_back``): code that asks who called it depends on a call depth and on CPython."""


def _frame_introspection_in(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in FRAME_NAMES - {"stack"}:
            found.append(f"{ast.unparse(node)} (line {node.lineno})")
        elif isinstance(node, ast.Attribute) and node.attr == "stack" and ast.unparse(node.value) == "inspect":
            found.append(f"inspect.stack (line {node.lineno})")
        elif isinstance(node, ast.ImportFrom) and node.module in ("sys", "inspect"):
            found += [f"from {node.module} import {a.name}" for a in node.names if a.name in FRAME_NAMES]
    return found


def test_no_frame_introspection() -> None:
    """No module reads the call stack (``sys._getframe``, ``inspect.currentframe``, ``f_lasti``)."""
    found = {}
    for module, path in MODULES.items():
        frames = _frame_introspection_in(ast.parse(path.read_text()))
        if frames:
            found[module] = frames
    assert found == {}


def test_the_frame_check_sees_frame_introspection() -> None:
    source = (
        "import sys, inspect\nf = sys._getframe(2)\ng = inspect.currentframe()\nf.f_lasti\nf.f_back\n"
        "inspect.stack()\nfrom sys import _getframe\n"
    )
    assert len(_frame_introspection_in(ast.parse(source))) == 6
    assert _frame_introspection_in(ast.parse("import inspect\ninspect.signature(f)\nself.stack.pop()")) == []


def _sleeps_in(tree: ast.AST) -> list[int]:
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, (ast.Attribute, ast.Name))
        and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "sleep"
    ]


def test_only_the_retry_loop_waits() -> None:
    """Retries and waits (lock files, lost races, stale reads) go through ``engine/retry.py``: nothing else sleeps."""
    found = {
        module: lines
        for module, path in MODULES.items()
        if _layer_of(module) != "cli"
        and module != "shardkv.engine.retry"
        and (lines := _sleeps_in(ast.parse(path.read_text())))
    }
    assert found == {}


def test_the_sleep_check_sees_a_sleep() -> None:
    assert _sleeps_in(ast.parse("import time\ntime.sleep(0.001)\nfrom time import sleep\nsleep(1)")) == [2, 4]
    assert _sleeps_in(ast.parse("event.wait(1)\nlock.acquire(timeout=1)")) == []


_GENERIC = {"tuple", "dict", "list", "set", "frozenset", "type", "Literal", "Union", "Optional", "Callable"}


def _spelling(node: ast.expr) -> str | None:
    """A module-level value that names one idea, spelled one way; ``None`` for any other value.

    Type aliases (``A | B``, ``Union[A, B]``, ``tuple[...]``, ``Literal[...]``, ...), with ``Union`` and
    ``Optional`` spelled with ``|``; one-line string constants; ``frozenset({...})`` of constants.
    """
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and "\n" not in node.value:
        return repr(node.value)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "frozenset":
        return ast.unparse(node)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        sides = [_type_spelling(node.left), _type_spelling(node.right)]
        return None if None in sides else " | ".join(s for s in sides if s is not None)
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in _GENERIC:
        return _type_spelling(node)
    return None


def _type_spelling(node: ast.expr) -> str | None:
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in ("Union", "Optional"):
        members = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        spelled = [_type_spelling(m) for m in members] + (["None"] if node.value.id == "Optional" else [])
        return None if None in spelled else " | ".join(s for s in spelled if s is not None)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _spelling(node)
    if isinstance(node, (ast.Name, ast.Attribute, ast.Subscript)) or (
        isinstance(node, ast.Constant) and node.value is None
    ):
        return ast.unparse(node)
    return None


def _definitions(tree: ast.Module) -> list[tuple[str, int, str]]:
    """``(name, line, spelling)`` of the module-level type aliases and constants (see :func:`_spelling`)."""
    return [
        (node.targets[0].id, node.lineno, spelled)
        for node in tree.body
        if isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
        and (spelled := _spelling(node.value)) is not None
    ]


def test_each_alias_and_constant_is_defined_once() -> None:
    """One name per idea: no two modules define the same type alias or constant (a shared one: ``_types.py``)."""
    where: dict[str, list[str]] = {}
    for module, path in MODULES.items():
        for name, line, spelled in _definitions(ast.parse(path.read_text())):
            where.setdefault(spelled, []).append(f"{module}:{line} {name}")
    assert {spelled: places for spelled, places in where.items() if len(places) > 1} == {}


def test_the_definition_check_sees_one_idea_spelled_two_ways() -> None:
    tree = ast.parse(
        "A = bytes | bytearray | memoryview\nB = Union[bytes, bytearray, memoryview]\nC = Optional[tuple[int, ...]]\n"
        "D = 'zarr.json'\nE = frozenset({'s3'})\nF = 4\nT = TypeVar('T')\nG = f(x)"
    )
    assert [(name, spelled) for name, _, spelled in _definitions(tree)] == [
        ("A", "bytes | bytearray | memoryview"),
        ("B", "bytes | bytearray | memoryview"),
        ("C", "tuple[int, ...] | None"),
        ("D", "'zarr.json'"),
        ("E", "frozenset({'s3'})"),
    ]


def test_no_issue_numbers_in_the_code() -> None:
    """Code, docstrings and comments say what and why; an issue number means nothing to a reader of the code."""
    issue = re.compile(r"\bissues? #?\d+", re.IGNORECASE)
    folders = [ROOT / "shardkv", ROOT / "transformers", ROOT / "tests", ROOT / "benchmarks"]
    found = [
        f"{path.relative_to(ROOT)}:{n}"
        for folder in folders
        for path in sorted(folder.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if issue.search(line)
    ]
    assert found == []


# what parses chunk-likeness of a key: a chunk-segment regex ("c|c?[0-9]..."), a per-part isdigit test
# of a split segment, or a helper named after chunk-like segments
_CHUNK_PATTERN = ("c?[0-9", "c|")
_CHUNK_NAMES = ("chunkish", "chunk_segment", "chunk_like")


def _chunk_parsing_in(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if any(p in node.value for p in _CHUNK_PATTERN) and "[0-9" in node.value:
                found.append(repr(node.value))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if any(n in node.name.lower() for n in _CHUNK_NAMES):
                found.append(f"def {node.name}")
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            if any(n in node.id.lower() for n in _CHUNK_NAMES):
                found.append(node.id)
    return found


def test_only_keys_parses_chunk_likeness_of_a_path() -> None:
    """Which array owns a key is one rule (``shardkv/keys/paths.py``): no other module parses chunk-like segments."""
    found = {}
    for module, path in MODULES.items():
        if _layer_of(module) != "keys":
            parsing = _chunk_parsing_in(ast.parse(path.read_text()))
            if parsing:
                found[module] = parsing
    assert found == {}


def test_the_chunk_parsing_check_sees_a_chunk_rule() -> None:
    source = '_CHUNKISH = re.compile(r"c|c?[0-9.+-]+")\ndef _chunkish(segment): ...\nSEG = r"c?[0-9]+"'
    found = sorted(_chunk_parsing_in(ast.parse(source)))
    assert found == ["'c?[0-9]+'", "'c|c?[0-9.+-]+'", "_CHUNKISH", "def _chunkish"]
    assert _chunk_parsing_in(ast.parse('KEY = "c/0/1"\nn = re.compile(r"[0-9]+")')) == []


_OWNER_PATHS = {"chunk_owner_paths", "prefix_owner_paths", "owner_candidates"}
_NODE_WALK = "shardkv.metadata.nodes"  # the one owner walk over a facade's nodes


def _owner_walks_in(tree: ast.AST) -> list[str]:
    """The loops that iterate over the paths that could own a key (a walk of their own)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)) and isinstance(node.iter, ast.Call):
            func = node.iter.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name in _OWNER_PATHS:
                found.append(name)
    return found


def test_only_the_node_table_walks_the_owner_paths() -> None:
    """The facades' node tables ask :class:`shardkv.metadata.nodes.NodeCache` for owners: no walk of their own."""
    found = {}
    for module, path in MODULES.items():
        if _layer_of(module) != "keys" and module != _NODE_WALK:
            walks = _owner_walks_in(ast.parse(path.read_text()))
            if walks:
                found[module] = walks
    assert found == {}


def test_the_owner_walk_check_sees_a_walk() -> None:
    source = (
        "async def route(self, key):\n    for path in chunk_owner_paths(key):\n        node = await self.node(path)\n"
        "def owner(key):\n    return next(p for p in paths.owner_candidates(key) if p in arrays)\n"
    )
    assert _owner_walks_in(ast.parse(source)) == ["chunk_owner_paths", "owner_candidates"]
    assert _owner_walks_in(ast.parse("walked = cache.first(chunk_owner_paths(key), is_array, read)")) == []
