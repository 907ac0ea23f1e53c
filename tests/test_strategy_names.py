"""Strategy knowledge lives in the strategies (issue 35): no string comparison on a strategy name outside
``ops/run/strategies/`` (the registry is the only switch), found by reading every module of ``tui/`` as Python: a
comparison (``==``, ``!=``, ``in``, ``not in``) with a registered name or a collection of them, or a ``match`` case on
one. A name that is also a word of another vocabulary (``drain`` is a run kind and a stage too) counts when the other
side is not one of those (``run.kind``, ``event.stage``, the console preview's ``scenario``...)."""

from __future__ import annotations

import ast
from pathlib import Path

from celeryops.ops.run.strategies import STRATEGIES

TUI = Path(__file__).resolve().parents[1] / "tui"
OWN = TUI / "celeryops" / "ops" / "run" / "strategies"
#: The other vocabularies that share a word with a strategy's name: what a compared expression is called there.
OTHER_WORDS = ("kind", "stage", "start", "step", "view", "phase", "action", "event", "role", "scenario")


def _names(node: ast.AST) -> set[str]:
    """The registered strategy names ``node`` is, or holds (a tuple, list or set of constants)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & set(STRATEGIES)
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return {n for elt in node.elts for n in _names(elt)}
    return set()


def _other_vocabulary(node: ast.AST) -> bool:
    text = ast.unparse(node).rsplit(".", 1)[-1].strip("()")
    return any(text == word or text.endswith(f"_{word}") for word in OTHER_WORDS)


def findings(tree: ast.AST) -> list[tuple[int, str]]:
    """Where ``tree`` compares with a strategy's name: (line, the source of the comparison)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for i, operand in enumerate(operands):
                others = [o for j, o in enumerate(operands) if j != i]
                if _names(operand) and not any(_other_vocabulary(o) for o in others):
                    found.append((node.lineno, ast.unparse(node)))
                    break
        elif isinstance(node, ast.match_case):
            for pattern in ast.walk(node.pattern):
                if isinstance(pattern, ast.MatchValue) and _names(pattern.value):
                    found.append((pattern.lineno, ast.unparse(pattern)))
    return found


def test_the_scan_finds_what_it_looks_for() -> None:
    """A comparison, a membership test and a match case on a name are found; a run kind's is not."""
    name = next(iter(STRATEGIES))
    source = (f"if strategy == {name!r}: pass\n"
              f"if t.strategy in ({name!r}, 'x'): pass\n"
              f"match s:\n    case {name!r}: pass\n"
              f"if run.kind == {name!r} or stage != {name!r}: pass\n")
    assert [line for line, _ in findings(ast.parse(source))] == [1, 2, 4]


def test_no_string_comparison_on_a_strategy_name_outside_the_strategies() -> None:
    found = []
    for path in sorted(TUI.rglob("*.py")):
        if OWN in path.parents:
            continue
        for line, text in findings(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            found.append(f"{path.relative_to(TUI)}:{line}: {text}")
    assert not found, "strategy names compared outside ops/run/strategies/ (ask the registry):\n" + "\n".join(found)
