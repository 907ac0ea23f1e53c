"""The console's footer: Textual's :class:`~textual.widgets.Footer`, rebuilt only when what it shows changed, and
once for a burst of changes.

Textual's Footer removes and mounts every key at each bindings update of its screen (a focus move, the screen
resumed, every ``refresh_bindings()``), each time after the next refresh. The console's start made four such
updates, and the two rebuilds that differed came ~0.2 s later, one after the other, just as the fleet came in: a
recompose, a style pass over every key, a layout and a repaint each, on the event loop. Here an update that leaves
the shown keys (binding, enabled, tooltip: all the footer's ``compose`` reads) as the footer shows them is skipped,
and one rebuild is pending at most: it reads the keys as they are when it runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.widgets import Footer

if TYPE_CHECKING:
    from textual.screen import Screen


class ConsoleFooter(Footer):
    """A :class:`~textual.widgets.Footer` that skips the bindings updates which change none of its keys and rebuilds
    once for several."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._keys_shown: tuple[object, ...] | None = None  # what the footer shows, or will once rebuilt
        self._rebuild_due = False

    def shown_keys(self, screen: Screen) -> tuple[object, ...]:
        """What ``compose`` shows for ``screen`` now: each shown binding with its state, the command palette's key,
        and the footer's own settings."""
        active = screen.active_bindings
        keys = tuple((binding, enabled, tooltip) for _, binding, enabled, tooltip in active.values() if binding.show)
        palette = active.get(self.app.COMMAND_PALETTE_BINDING)
        return keys, None if palette is None else palette[1:], self.compact, self.show_command_palette

    def bindings_changed(self, screen: Screen) -> None:
        """Footer's rule (keys shown from the first update on; no rebuild while the app has no focus, nor for
        another screen's update), less the rebuilds that would show the same keys."""
        self._bindings_ready = True
        if not (screen.app.app_focus and self.is_attached and screen is self.screen):
            self._keys_shown = None  # not rebuilt now: the next update rebuilds
            return
        shown = self.shown_keys(screen)
        if shown == self._keys_shown:
            return
        self._keys_shown = shown
        if not self._rebuild_due:
            self._rebuild_due = True
            self.call_after_refresh(self._rebuild)

    async def _rebuild(self) -> None:
        self._rebuild_due = False
        await self.recompose()
