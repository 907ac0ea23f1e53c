"""Import-layer check: the architecture's arrows, enforced on the source text.

- Textual may be imported only inside ``celeryops.console``.
- The worker-side modules (``celeryops.slots``, ``celeryops.fence``) import neither Textual nor Google libraries.
- ``ops`` modules never import the console.
Exits 1 with one line per violation.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "tui" / "celeryops"
WORKER_SIDE = ("celeryops.slots", "celeryops.fence")
# Modules allowed to import the console (the entry points).
CONSOLE_IMPORTERS = ("celeryops.cli", "celeryops.console", "celeryops.demo", "celeryops.commands")


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(tree: ast.AST, current: str) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = current.split(".")
                base = base[: len(base) - node.level + (1 if current.endswith("__init__") else 0)]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            found.append((node.lineno, name))
    return found


def within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def check() -> list[str]:
    problems: list[str] = []
    for path in sorted(ROOT.rglob("*.py")):
        mod = module_name(path)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        pkg_mod = mod + ".__init__" if path.name == "__init__.py" else mod
        for lineno, name in imported_modules(tree, pkg_mod):
            where = f"{path.relative_to(ROOT.parent.parent)}:{lineno}"
            if within(name, ("textual",)) and not within(mod, ("celeryops.console",)):
                problems.append(f"{where}: {mod} imports {name}; Textual belongs in celeryops.console only")
            if within(mod, WORKER_SIDE) and within(name, ("textual", "google", "grpc")):
                problems.append(f"{where}: worker-side {mod} imports {name}")
            if within(name, ("celeryops.console",)) and not within(mod, CONSOLE_IMPORTERS):
                problems.append(f"{where}: {mod} imports the console ({name}); ops must not depend on it")
    return problems


if __name__ == "__main__":
    issues = check()
    for line in issues:
        print(line)
    sys.exit(1 if issues else 0)
