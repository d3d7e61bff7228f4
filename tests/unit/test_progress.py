"""How often progress is logged and printed."""

from harness.run.progress import intervals


def test_rows_are_rare_enough_and_lines_are_rows():
    assert intervals(0, 0, 100) == (10, 10)  # the main job: a row and a line every 10 steps
    assert intervals(0, 0, 12) == (10, 10)
    assert intervals(0, 0, 10000) == (100, 1000)
    assert intervals(1, 0, 5) == (1, 1)
    assert intervals(0, 27, 1000) == (10, 30)  # a line is a row's: the nearest multiple
    assert intervals(4, 6, 100) == (4, 8)
