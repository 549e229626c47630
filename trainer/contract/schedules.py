"""The pipeline schedules a plan may name, and the families that the rules, the planner and the trainer tell apart.

    schedule         model chunks a rank (virtual_stages)        micro-batches m a step needs (pp > 1)   backward
    gpipe            1                                           any                                     whole
    1f1b             1                                           m ≥ pp                                  whole
    interleaved      v ≥ 2, looped: rank r holds r, r+p, …       m ≥ pp, in ⌊m/pp⌋ equal rounds          whole
    zb-interleaved   any v, looped                               m ≥ pp, in ⌊m/pp⌋ equal rounds          split
    zbv              exactly 2, in a V: rank r holds r, 2p−1−r   m ≥ 2·pp − 1                            split
    dualpipev        exactly 2, in a V                           m ≥ 2·pp                                split

1F1B fills the pipeline before its first backward; the looped schedules run their micro-batches in rounds of pp; the
V-shaped ones send each micro-batch down and back up the ranks before its backward (zbv's warm-up takes 2·pp − 1,
dualpipev one per stage), and a V puts both ends of the model on rank 0. A split backward computes the input
gradient first and defers the weight gradient into the idle time (the zero-bubble schedules, Qi et al. 2023). The
micro-batch counts are what torch's schedules need, so the native engine's; DeepSpeed's pipeline engine runs its own
1F1B over any m. What a plan is refused for on these grounds is decided in ``rules``.
"""
from __future__ import annotations

from typing import Literal

Schedule = Literal["gpipe", "1f1b", "interleaved", "zb-interleaved", "zbv", "dualpipev"]

LOOPED_SCHEDULES = ("interleaved", "zb-interleaved")
V_SCHEDULES = ("zbv", "dualpipev")
MULTI_CHUNK_SCHEDULES = LOOPED_SCHEDULES + V_SCHEDULES  # those that may hold several model chunks a rank
ZERO_BUBBLE = ("zb-interleaved", "zbv", "dualpipev")


def least_micro_batches(schedule: str, pp: int) -> int:
    """The fewest micro-batches a step of ``schedule`` over pp > 1 pipeline ranks runs with (the table above)."""
    return {"gpipe": 1, "zbv": 2 * pp - 1, "dualpipev": 2 * pp}.get(schedule, pp)
