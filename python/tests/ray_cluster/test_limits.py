"""The job's width and back-off (`rlm_kernel.ray._limits.Width`), on a fake clock, and the
retries read from a run's result; no cluster needed."""

from rlm_kernel.ray._limits import (
    AUTO_CEILING,
    AUTO_START,
    DEFAULT_WIDTH,
    PAUSE_MAX_S,
    Width,
    job_width,
    retries_of,
)


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_the_width_is_split_among_the_actors_and_never_below_one_each():
    assert job_width(None) == (DEFAULT_WIDTH, DEFAULT_WIDTH)
    assert job_width(12) == (12, 12)
    assert job_width("auto") == (AUTO_START, AUTO_CEILING)
    assert Width(12, 12, actors=4).share() == (3, 0.0)
    assert Width(13, 13, actors=4).share()[0] == 3  # never more than the width in all
    assert Width(2, 2, actors=4).share()[0] == 1  # (the pool is cut to the width before)


def test_a_retry_halves_the_width_and_pauses_every_actor_until_rows_go_clean():
    clock = Clock()
    width = Width(64, 64, actors=4, clock=clock)
    width.report(retries=3)
    assert width.share() == (8, 1.0)  # 32 over 4 actors, 1 s pause for every actor
    width.report(retries=1)  # during the pause: halved again, the pause doubled
    assert width.share() == (4, 2.0)
    clock.now += 2.5
    assert width.share() == (4, 0.0)
    for _ in range(5):
        width.report(retries=0)
    assert width.share() == (5, 0.0)  # 21 over 4: grows back by one a clean row
    stats = width.stats()
    assert (stats["rows"], stats["rows_retried"], stats["retries"]) == (7, 2, 4)
    assert (stats["lowest_width"], stats["pauses"]) == (16, 1)


def test_the_width_never_drops_below_one_request_per_actor_and_the_pause_is_capped():
    clock = Clock()
    width = Width(16, 16, actors=4, clock=clock)
    for _ in range(20):
        width.report(retries=1)
    assert width.share()[0] == 1 and width.width == 4
    assert width.share()[1] <= PAUSE_MAX_S
    for _ in range(100):
        width.report(retries=0)
    assert width.width == 16  # back up to the ceiling, not past it


def test_retries_count_every_attempt_past_the_first_of_root_and_sub_calls():
    result = {
        "iterations": [
            {"root_call": {"attempts": 2}},
            {"root_call": None},
            {"root_call": {"attempts": 1}},
        ],
        "sub_calls": [{"attempts": 1}, {"attempts": 4}, {"attempts": 0}],
    }
    assert retries_of(result) == 1 + 3
    assert retries_of({}) == 0
