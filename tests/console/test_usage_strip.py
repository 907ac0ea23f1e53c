"""The slots view's usage strip is drawn on the resource's own scale: full looks full, idle looks idle, whatever the
other samples are (Textual's Sparkline drew a pool held full all along as empty)."""

from __future__ import annotations

from celeryops.console.widgets.usage import BARS, FULL, usage_columns, usage_text


def test_a_pool_held_full_all_along_draws_full_and_an_idle_one_draws_the_floor() -> None:
    assert usage_columns([4, 4, 4], 4, 10) == [FULL, FULL, FULL]
    assert usage_columns([0, 0, 0], 4, 10) == [0, 0, 0]
    assert usage_text([1, 1], 1, 5).plain == "   " + BARS[FULL] * 2  # newest at the right edge
    assert usage_text([0], 4, 5).plain == "    " + BARS[0]


def test_levels_follow_the_share_of_the_total_and_any_use_rises_above_the_floor() -> None:
    assert usage_columns([0, 1, 2, 3, 4], 4, 10) == [0, 2, 4, 5, FULL]
    assert usage_columns([1], 64, 10) == [1]  # 1 of 64 in use is not nothing
    assert usage_columns([9], 4, 10) == [FULL]  # a shrunken pool still holding more than its total
    assert usage_columns([2], 0, 10) == [1]  # no capacity left: in use, the share unknown


def test_more_samples_than_columns_keep_the_busiest_sample_of_each_column() -> None:
    history = [0] * 30 + [4] + [0] * 29
    levels = usage_columns(history, 4, 20)
    assert len(levels) == 20 and levels.count(FULL) == 1 and levels.count(0) == 19
    assert usage_columns(list(range(5)), 4, 0) == [] and usage_columns([], 4, 10) == []
