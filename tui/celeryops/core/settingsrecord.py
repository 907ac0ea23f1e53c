"""A settings table as a run journals it (the ``[canary]`` and ``[autoscale]`` tables): its fields as a plain dict,
written with the run, and read back from that dict by its resume, by another version of celeryops included (unknown
keys left out, missing ones at their defaults). Pure data, no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import Field, fields
from typing import Any, ClassVar, Self


class SettingsRecord:
    """For a frozen dataclass of plain values: :meth:`to_dict` and :meth:`from_dict`. ``LIST_FIELDS``: the fields
    that hold a tuple of names (written as a list)."""

    LIST_FIELDS: ClassVar[tuple[str, ...]] = ()
    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # a dataclass's (for the type checker)

    def to_dict(self) -> dict[str, object]:
        return {f.name: list(getattr(self, f.name)) if f.name in self.LIST_FIELDS else getattr(self, f.name)
                for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Self:
        """The settings :meth:`to_dict` wrote (unknown keys left out, missing ones at their defaults)."""
        known = {f.name for f in fields(cls)}
        values: dict[str, Any] = {k: v for k, v in data.items() if k in known}
        for name in cls.LIST_FIELDS:
            if name in values:
                values[name] = tuple(str(x) for x in values[name] or ())
        return cls(**values)


__all__ = ["SettingsRecord"]
