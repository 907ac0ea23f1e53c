"""The private Textual names the console (and its bench) override, call or read, looked up in the installed Textual:
an upgrade that removes or renames one, or changes what it is (a method's parameters, a property become an
attribute), fails here with one sentence naming it and what uses it, instead of as a wrong screen in the field.
Textual is pinned (pyproject: textual==8.2.8); bump the pin only with this test green.

The list is also complete: every private name that the console's code uses and that Textual's classes define (the
classes the console's own classes derive from, and the row index's TwoWayDict) must be on it, so a new use, or one
of our own names that a new Textual also defines (which would silently override Textual's), fails here too."""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import pkgutil
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import textual

import celeryops.console
from celeryops.console.terminal import driver_class

ROOT = Path(__file__).resolve().parents[2]
CONSOLE = "tui/celeryops/console"
TASK_TABLE = f"{CONSOLE}/widgets/task_table.py"
TASK_ROWS = f"{CONSOLE}/widgets/task_rows.py"
TERMINAL = f"{CONSOLE}/terminal.py"
BENCH = "bench/bench_console.py"
SCANNED = (CONSOLE, BENCH)

Kind = Literal["method", "property", "attribute", "module"]


@dataclass(frozen=True)
class Private:
    owner: str  # a Textual class ("textual.widgets.DataTable") or, for kind "module", a Textual module
    name: str
    kind: Kind  # what it is in Textual: a method, a property, an instance attribute, a name in a module
    use: str  # how the console uses it: "overrides" | "calls" | "reads" | "reads and writes" | "imports"
    where: str  # the file that uses it
    params: tuple[str, ...] | None = None  # a method's parameters (after self) the override or the call relies on


DATATABLE = "textual.widgets.DataTable"
LINUX_DRIVER = "textual.drivers.linux_driver.LinuxDriver"
TWO_WAY_DICT = "textual._two_way_dict.TwoWayDict"

PRIVATE = (
    # TaskTable (one-line rows updated in place, painted without Rich for plain cells): DataTable's internals
    Private(DATATABLE, "_y_offsets", "property", "overrides", TASK_TABLE),
    Private(DATATABLE, "_get_row_style", "method", "overrides", TASK_TABLE, ("row_index", "base_style")),
    Private(DATATABLE, "_render_line_in_row", "method", "overrides", TASK_TABLE,
            ("row_key", "line_no", "base_style", "cursor_location", "hover_location")),
    Private(DATATABLE, "_render_cell", "method", "overrides", TASK_TABLE,
            ("row_index", "column_index", "base_style", "width", "cursor", "hover")),
    Private(DATATABLE, "_update_dimensions", "method", "overrides", TASK_TABLE, ("new_rows",)),
    Private(DATATABLE, "_size_updated", "method", "overrides", TASK_TABLE,
            ("size", "virtual_size", "container_size", "layout")),
    Private(DATATABLE, "_get_styles_to_render_cell", "method", "calls", TASK_TABLE,
            ("is_header_cell", "is_row_label_cell", "is_fixed_style_cell", "hover", "cursor", "show_cursor",
             "show_hover_cursor", "has_css_foreground_priority", "has_css_background_priority")),
    Private(DATATABLE, "_highlight_cursor", "method", "calls", TASK_TABLE, ()),
    Private(DATATABLE, "_row_label_column_width", "property", "reads", TASK_TABLE),
    Private(DATATABLE, "_row_locations", "attribute", "reads and writes", TASK_TABLE),
    Private(DATATABLE, "_row_locations", "attribute", "reads", TASK_ROWS),
    Private(DATATABLE, "_column_locations", "attribute", "reads", TASK_TABLE),
    Private(DATATABLE, "_data", "attribute", "reads and writes", TASK_TABLE),
    Private(DATATABLE, "_update_count", "attribute", "reads and writes", TASK_TABLE),
    Private(DATATABLE, "_require_update_dimensions", "attribute", "reads and writes", TASK_TABLE),
    Private(DATATABLE, "_require_update_dimensions", "attribute", "reads", BENCH),
    Private(DATATABLE, "_updated_cells", "attribute", "reads and writes", TASK_TABLE),
    Private(DATATABLE, "_row_render_cache", "attribute", "reads and writes", TASK_TABLE),
    Private(DATATABLE, "_pseudo_class_state", "attribute", "reads", TASK_TABLE),
    Private(DATATABLE, "_show_hover_cursor", "attribute", "reads", TASK_TABLE),
    Private(DATATABLE, "_labelled_row_exists", "attribute", "reads", TASK_TABLE),
    Private(TWO_WAY_DICT, "_reverse", "attribute", "reads and writes", TASK_TABLE),
    Private(TWO_WAY_DICT, "_forward", "attribute", "writes", TASK_TABLE),
    Private(TWO_WAY_DICT, "_reverse", "attribute", "reads", TASK_ROWS),
    Private("textual._two_way_dict", "TwoWayDict", "module", "imports", TASK_TABLE),
    Private("textual._types", "SegmentLines", "module", "imports", TASK_TABLE),
    Private("textual.widgets._data_table", "default_cell_formatter", "module", "imports", TASK_TABLE),
    # The hang-up-safe terminal driver
    Private(LINUX_DRIVER, "_sigtstp_application", "method", "overrides", TERMINAL, ("_",)),
    Private(LINUX_DRIVER, "_sigcont_application", "method", "overrides", TERMINAL, ("_",)),
    Private(LINUX_DRIVER, "_file", "attribute", "reads and writes", TERMINAL),
    Private(LINUX_DRIVER, "_loop", "attribute", "reads", TERMINAL),
    # Read-only screens drop their dangerous bindings
    Private("textual.screen.Screen", "_bindings", "attribute", "reads and writes", f"{CONSOLE}/screens/base.py"),
    # A refilled table shows or hides its scrollbars as its content's size changes (screens/base.py, refill)
    Private(DATATABLE, "_refresh_scrollbars", "method", "calls", f"{CONSOLE}/screens/base.py", ()),
    # The footer rebuilt only when its keys changed (Footer.bindings_changed's rule, less the same-keys rebuilds)
    Private("textual.widgets.Footer", "_bindings_ready", "attribute", "writes", f"{CONSOLE}/widgets/footer.py"),
    # Parsed stylesheets kept from one start to the next (console/csscache.py)
    Private("textual.css.stylesheet.Stylesheet", "_parse_cache", "attribute", "reads", f"{CONSOLE}/csscache.py"),
    Private("textual.css.stylesheet.Stylesheet", "_variables", "attribute", "reads", f"{CONSOLE}/csscache.py"),
    # The bench turns each frame into terminal bytes, as a real terminal's app does
    Private("textual.app.App", "_display", "method", "overrides", BENCH, ("screen", "renderable")),
    Private("textual._compositor", "CompositorUpdate", "module", "imports", BENCH),
)


def resolve(path: str) -> type:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]


def defined_by(cls: type) -> dict[str, Kind]:
    """The names Textual's classes in ``cls``'s MRO define: methods and properties, and instance attributes (what
    their code assigns to ``self.<name>``)."""
    names: dict[str, Kind] = {}
    for klass in reversed(cls.__mro__):
        if klass.__module__.startswith("textual"):
            names.update(own_names(klass))
    return names


@functools.cache
def own_names(klass: type) -> dict[str, Kind]:
    names: dict[str, Kind] = {}
    for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(klass)))):
        if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name) and node.value.id == "self"):
            names[node.attr] = "attribute"
    for name, value in vars(klass).items():
        if isinstance(value, property):
            names[name] = "property"
        elif callable(value) or isinstance(value, staticmethod | classmethod):
            names[name] = "method"
    return names


def missing(entry: Private) -> str | None:
    """One sentence when the installed Textual does not have ``entry`` as the console uses it, else None."""
    version, where = textual.__version__, entry.where
    if entry.kind == "module":
        try:
            found = hasattr(importlib.import_module(entry.owner), entry.name)
        except ImportError:
            found = False
        return None if found else (f"Textual {version} has no {entry.owner}.{entry.name}, which {where} "
                                   f"{entry.use}: adapt {where} to this Textual (or keep textual==8.2.8).")
    cls = resolve(entry.owner)
    kind = defined_by(cls).get(entry.name)
    if kind is None:
        return (f"Textual {version} has no {entry.owner}.{entry.name}, which {where} {entry.use}: adapt {where} to "
                "this Textual (or keep textual==8.2.8).")
    if kind != entry.kind:
        return (f"Textual {version}'s {entry.owner}.{entry.name} is now a {kind}, not the {entry.kind} {where} "
                f"{entry.use}: adapt {where} to this Textual (or keep textual==8.2.8).")
    if entry.params is not None:
        params = tuple(list(inspect.signature(getattr(cls, entry.name)).parameters)[1:])
        if params != entry.params:
            return (f"Textual {version}'s {entry.owner}.{entry.name} takes ({', '.join(params)}), not "
                    f"({', '.join(entry.params)}) as {where} {entry.use} it: adapt {where} to this Textual (or keep "
                    "textual==8.2.8).")
    return None


def textual_classes() -> dict[str, type]:
    """Textual's classes the console's classes derive from (and the row index's TwoWayDict), by full name."""
    found = {TWO_WAY_DICT: resolve(TWO_WAY_DICT)}
    classes: list[type] = [driver_class() or object]
    for info in pkgutil.walk_packages(celeryops.console.__path__, "celeryops.console."):
        module = importlib.import_module(info.name)
        classes += [obj for obj in vars(module).values() if inspect.isclass(obj) and obj.__module__ == info.name]
    for cls in classes:
        found.update({f"{c.__module__}.{c.__qualname__}": c for c in cls.__mro__ if c.__module__.startswith("textual")})
    return found


def private_uses(path: Path) -> tuple[set[str], set[str]]:
    """Private names a file uses (attributes read or written, methods defined) and the private Textual modules it
    imports from."""
    names: set[str] = set()
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "textual" and any(
                part.startswith("_") for part in node.module.split(".")):
            modules.add(node.module)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}, modules


def test_every_private_textual_name_the_console_uses_is_listed_and_in_the_installed_textual() -> None:
    problems = [sentence for entry in PRIVATE if (sentence := missing(entry)) is not None]

    # Complete: what the code uses and Textual defines is listed; what is listed is still used.
    textual_names: dict[str, list[str]] = {}
    for full_name, cls in textual_classes().items():
        for name in defined_by(cls):
            textual_names.setdefault(name, []).append(full_name)
    files = sorted({p for scanned in SCANNED for p in ([ROOT / scanned] if scanned.endswith(".py") else
                                                        (ROOT / scanned).rglob("*.py"))})
    assert files, f"nothing to scan under {ROOT}"
    for path in files:
        where = path.relative_to(ROOT).as_posix()
        names, modules = private_uses(path)
        listed = {(e.name if e.kind != "module" else e.owner) for e in PRIVATE if e.where == where}
        for name in sorted((names & set(textual_names)) - listed):
            owners = sorted(textual_names[name])
            problems.append(f"{where} uses {name}, which Textual's {', '.join(owners)} "
                            f"{'defines' if len(owners) == 1 else 'define'}, and it is not listed here: add it to "
                            "PRIVATE (or rename ours if it is our own name: it would override Textual's).")
        for module in sorted(modules - listed):
            problems.append(f"{where} imports from Textual's private module {module}, which is not listed here: add "
                            "it to PRIVATE.")
        for name in sorted(listed - names - modules):
            problems.append(f"{where} no longer uses {name}: remove it from PRIVATE.")
    assert not problems, "\n".join(problems)
