"""Exact instance counts per revision through a worker pool's instance split (whole percents). Pure.

Cloud Run divides a worker pool's ``manual_instance_count`` among the revisions of its split in proportion to their
percent: each revision gets its share rounded down, and the instances left over go one each to the largest
remainders (a tie: the revision listed first). :func:`counts_of` is that division (what runs per revision);
:func:`split_for` the inverse: a split that this division turns back into exactly the counts asked, for up to 100
instances in all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from celeryops.core.canary import canary_split

Split = tuple[tuple[str, int], ...]


def counts_of(count: int, split: Sequence[tuple[str, int]]) -> dict[str, int]:
    """The instances each revision of ``split`` runs when the pool runs ``count`` (a revision listed twice adds
    up; every revision of the split is in the result, 0 when it gets none)."""
    merged: dict[str, int] = {}
    for revision, percent in split:
        merged[revision] = merged.get(revision, 0) + max(0, int(percent))
    total = sum(merged.values())
    if count <= 0 or total <= 0:
        return dict.fromkeys(merged, 0)
    out = {rev: count * pct // total for rev, pct in merged.items()}  # integers: equal remainders are ties
    rest = {rev: count * pct % total for rev, pct in merged.items()}
    order = list(merged)
    by_remainder = sorted(order, key=lambda rev: (-rest[rev], order.index(rev)))
    for rev in by_remainder[:count - sum(out.values())]:
        out[rev] += 1
    return out


def split_for(counts: Mapping[str, int]) -> Split:
    """A split whose division gives exactly ``counts`` (revision -> instances, at most 100 in all, revisions with
    none left out). Each revision gets its share of 100 rounded down, the percents left over go to the largest
    fractions; the revisions rounded down are listed first, so that the division's ties give them their instance
    back. Raises ValueError for no instance at all or more than 100."""
    wanted = {rev: n for rev, n in counts.items() if n > 0}
    total = sum(wanted.values())
    if total <= 0 or total > 100:
        raise ValueError(f"an exact split needs 1 to 100 instances in all, not {total}")
    pct = {rev: 100 * n // total for rev, n in wanted.items()}
    rest = {rev: 100 * n % total for rev, n in wanted.items()}
    order = list(wanted)
    up = sorted(order, key=lambda rev: (-rest[rev], order.index(rev)))[:100 - sum(pct.values())]
    for rev in up:
        pct[rev] += 1
    listed = [rev for rev in order if rev not in up] + [rev for rev in order if rev in up]
    return tuple((rev, pct[rev]) for rev in listed)


def exact_split(counts: Mapping[str, int]) -> Split:
    """The instance split that runs exactly ``counts[revision]`` instances of each revision (in that order; those
    with none left out): integer percentages that Cloud Run's division by percent (each revision its share rounded
    down, the rest to the largest remainders) turns back into exactly those counts, for two revisions and up to 100
    instances in all (:func:`~celeryops.core.canary.canary_split`; more revisions: :func:`split_for`, which may list
    them in another order to stay exact)."""
    live = [(rev, n) for rev, n in counts.items() if n > 0]
    if not live:
        raise ValueError("a pool runs at least one instance")
    if len(live) == 1:
        return ((live[0][0], 100),)
    if len(live) == 2:
        (old, count), (new, beside) = live
        return canary_split(old, new, count, beside)
    return split_for(dict(live))


def served_counts(count: int, served: Mapping[str, int]) -> dict[str, int]:
    """The instances each revision runs when the pool runs ``count`` divided by ``served`` (revision -> percent, in
    the order Cloud Run lists them: its ties go to the revision listed first); revisions with none left out."""
    return {rev: n for rev, n in counts_of(count, tuple(served.items())).items() if n > 0}


__all__ = ["Split", "counts_of", "exact_split", "served_counts", "split_for"]
