"""The ideal pipeline schedule: each rank's compute actions laid out in time as if communication were free.

An action is ``(kind, stage, microbatch)``: ``F`` forward, ``B`` full backward, ``I`` backward for the inputs (the
gradient the previous stage waits for), ``W`` backward for the weights (which nothing downstream waits for, so a
zero-bubble schedule moves it into the gaps). Every pipeline rank runs its own list of actions in order; an action
starts when its rank is free and the actions it depends on have ended:

    F(s, i)           after F(s−1, i)
    B(s, i), I(s, i)  after F(s, i) and after the B or I of (s+1, i); the last stage's only after its own F
    W(s, i)           after I(s, i)

Costs are in units of one stage's forward: F = 1, B = 2, I = 1, W = 1 unless told otherwise. A rank's idle share
is the part of the step (time 0 to the end of the last action of any rank) in which it runs nothing: the bubble that
the schedule itself makes, before any real transfer time or host overhead. For GPipe and 1F1B with p ranks and m
micro-batches it is (p−1)/(m+p−1); interleaving v stages per rank cuts it to (p−1)/(v·m+p−1).

The orders of ``gpipe``, ``1f1b`` and ``interleaved`` are generated here exactly as torch.distributed.pipelining's
ScheduleGPipe, Schedule1F1B and ScheduleInterleaved1F1B order their compute actions (interleaved places stages
"looped": rank r holds stages r, r+pp, …). The zero-bubble schedules have no generator: a profile holds the order
torch ran (``orders_from_json`` reads it), and that order is what the simulator lays out.

Standard library only: the web app draws the ideal schedule beside a measured profile.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

__all__ = ["KINDS", "UNIT_COSTS", "GENERATED", "Action", "Span", "RankTimeline", "Simulation", "ScheduleError",
           "Deadlock", "simulate", "stage_weights", "schedule_orders", "gpipe_order", "one_f_one_b_order",
           "interleaved_order", "orders_from_json", "label"]

KINDS = ("F", "B", "I", "W")
UNIT_COSTS: Mapping[str, float] = {"F": 1.0, "B": 2.0, "I": 1.0, "W": 1.0}
GENERATED = ("gpipe", "1f1b", "interleaved")  # the schedules whose order can be made without a recorded one

Action = tuple[str, int, int]  # (kind, stage, microbatch)


class ScheduleError(ValueError):
    """An order that cannot be a schedule: an unknown kind, an action listed twice, a malformed recorded order."""


class Deadlock(ScheduleError):
    """Every unfinished rank waits for an action that can never end before it."""


def label(action: Action) -> str:
    """How torch names an action in its profiler ranges (``PP:<stage><kind><microbatch>``), without the prefix."""
    kind, stage, microbatch = action
    return f"{stage}{kind}{microbatch}"


@dataclass(frozen=True)
class Span:
    start: float
    end: float
    kind: str
    stage: int
    microbatch: int

    @property
    def action(self) -> Action:
        return (self.kind, self.stage, self.microbatch)


@dataclass(frozen=True)
class RankTimeline:
    rank: int
    spans: tuple[Span, ...]
    busy: float
    idle_share: float


@dataclass(frozen=True)
class Simulation:
    ranks: tuple[RankTimeline, ...]
    makespan: float

    def rank(self, rank: int) -> RankTimeline:
        for timeline in self.ranks:
            if timeline.rank == rank:
                return timeline
        raise KeyError(f"no pipeline rank {rank} in this schedule")


# ---------------------------------------------------------------------------------------------- the simulator


def _checked(orders: Mapping[int, Sequence[Action]]) -> dict[int, list[Action]]:
    checked: dict[int, list[Action]] = {}
    seen: dict[Action, int] = {}
    backward_kind: dict[tuple[int, int], str] = {}
    for rank, actions in sorted(orders.items()):
        checked[rank] = []
        for action in actions:
            kind, stage, microbatch = action
            if kind not in KINDS:
                raise ScheduleError(f"rank {rank}: {action!r} is not a compute action (kinds: {', '.join(KINDS)})")
            if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in (stage, microbatch)):
                raise ScheduleError(f"rank {rank}: {action!r} needs a stage and a micro-batch ≥ 0")
            if action in seen:
                raise ScheduleError(f"{label(action)} is listed twice (ranks {seen[action]} and {rank})")
            if kind in "BI":
                other = backward_kind.setdefault((stage, microbatch), kind)
                if other != kind:
                    raise ScheduleError(f"stage {stage} micro-batch {microbatch} has both a full backward (B) and "
                                        f"a backward for inputs (I): one or the other")
            seen[action] = rank
            checked[rank].append((kind, stage, microbatch))
    return checked


def _dependencies(action: Action, last_stage: int, listed: Mapping[Action, object]) -> list[Action]:
    kind, stage, microbatch = action
    if kind == "F":
        return [("F", stage - 1, microbatch)] if stage > 0 else []
    if kind == "W":
        return [("I", stage, microbatch)]
    deps = [("F", stage, microbatch)]
    if stage < last_stage:
        later = ("I", stage + 1, microbatch)
        deps.append(later if later in listed else ("B", stage + 1, microbatch))
    return deps


def simulate(orders: Mapping[int, Sequence[Action]], costs: Mapping[str, float] | None = None,
             stage_costs: Mapping[int, float] | None = None) -> Simulation:
    """Lay each rank's actions out in time, in its order, each as early as its rank and dependencies allow.

    ``stage_costs`` scales every action of a stage (its layers against an equal stage's, under an uneven layout:
    ``stage_weights``); 1 where not given.

    Raises Deadlock, naming what each stuck rank waits for, when no order of events can run the lists to the end;
    ScheduleError for an order that is not one.
    """
    costs = {**UNIT_COSTS, **(costs or {})}
    checked = _checked(orders)
    where = {action: (rank, i) for rank, actions in checked.items() for i, action in enumerate(actions)}
    last_stage = max((stage for _, stage, _ in where), default=0)
    finish: dict[Action, float] = {}
    spans: dict[int, list[Span]] = {rank: [] for rank in checked}
    position = {rank: 0 for rank in checked}
    free = {rank: 0.0 for rank in checked}
    moved = True
    while moved:
        moved = False
        for rank, actions in checked.items():
            while position[rank] < len(actions):
                action = actions[position[rank]]
                deps = _dependencies(action, last_stage, where)
                if any(d not in finish for d in deps):
                    break
                start = max([free[rank]] + [finish[d] for d in deps])
                end = start + float(costs[action[0]]) * (stage_costs.get(action[1], 1.0) if stage_costs else 1.0)
                finish[action] = free[rank] = end
                spans[rank].append(Span(start, end, *action))
                position[rank] += 1
                moved = True
    stuck = {rank: actions[position[rank]] for rank, actions in checked.items() if position[rank] < len(actions)}
    if stuck:
        raise Deadlock(_deadlock_message(stuck, last_stage, where))
    makespan = max(finish.values(), default=0.0)
    timelines = []
    for rank, rank_spans in spans.items():
        busy = sum(s.end - s.start for s in rank_spans)
        timelines.append(RankTimeline(rank, tuple(rank_spans), busy, 1 - busy / makespan if makespan else 0.0))
    return Simulation(tuple(timelines), makespan)


def stage_weights(counts: Sequence[int]) -> dict[int, float]:
    """Each stage's cost against an equal stage's, from every stage's layer count (``contract.stages``): the cost
    ``simulate`` takes per stage."""
    mean = sum(counts) / len(counts)
    return {stage: n / mean for stage, n in enumerate(counts)}


def _deadlock_message(stuck: Mapping[int, Action], last_stage: int, where: Mapping[Action, tuple[int, int]]) -> str:
    waits = []
    for rank, action in sorted(stuck.items()):
        for dep in _dependencies(action, last_stage, where):
            if dep not in where:
                waits.append(f"rank {rank}'s next action {label(action)} waits for {label(dep)}, which no rank runs")
                break
            other, index = where[dep]
            if other in stuck:
                waits.append(f"rank {rank}'s next action {label(action)} waits for {label(dep)}, which rank {other} "
                             f"runs only after {label(stuck[other])}")
                break
    return "the order deadlocks: " + "; ".join(waits)


# ---------------------------------------------------------------------------------------------- generated orders


def gpipe_order(pp: int, microbatches: int) -> dict[int, list[Action]]:
    """ScheduleGPipe: every forward, then every backward, in micro-batch order."""
    return {r: [("F", r, i) for i in range(microbatches)] + [("B", r, i) for i in range(microbatches)]
            for r in range(pp)}


def one_f_one_b_order(pp: int, microbatches: int) -> dict[int, list[Action]]:
    """Schedule1F1B: pp − r forwards of warm-up on rank r, then one backward and one forward in turn, then the
    backwards left."""
    orders = {}
    for r in range(pp):
        warmup = min(microbatches, pp - r)
        order: list[Action] = [("F", r, i) for i in range(warmup)]
        forward = warmup
        for backward in range(microbatches):
            order.append(("B", r, backward))
            if forward < microbatches:
                order.append(("F", r, forward))
                forward += 1
        orders[r] = order
    return orders


def interleaved_order(pp: int, virtual_stages: int, microbatches: int) -> dict[int, list[Action]]:
    """ScheduleInterleaved1F1B's compute actions (torch's ``_get_1f1b_rank_ops`` without its empty slots): rank r
    holds stages r, r+pp, …, r+(v−1)·pp, and runs micro-batches in rounds of m // max(1, m // pp), depth first."""
    rounds = max(1, microbatches // pp)
    if microbatches % rounds:
        raise ScheduleError(f"interleaved 1F1B needs the micro-batches ({microbatches}) to be a multiple of its "
                            f"rounds ({rounds})")
    per_round, v = microbatches // rounds, virtual_stages
    orders = {}
    for r in range(pp):
        warmup = min((v - 1) * per_round + 2 * (pp - 1 - r), microbatches * v)
        steady = microbatches * v - warmup

        def forward_stage(step: int) -> int:
            return ((step // per_round) % v) * pp + r

        def backward_stage(step: int) -> int:
            return (v - 1 - ((step - warmup) // per_round) % v) * pp + r

        next_forward: dict[int, int] = {}
        next_backward: dict[int, int] = {}
        order: list[Action] = []

        def take(kind: str, stage: int, counters: dict[int, int]) -> None:
            counters[stage] = counters.get(stage, 0) + 1
            order.append((kind, stage, counters[stage] - 1))

        for op in range(warmup + steady + warmup):
            if op < warmup + steady:
                take("F", forward_stage(op), next_forward)
            if op >= warmup:
                take("B", backward_stage(op), next_backward)
        orders[r] = order
    return orders


def schedule_orders(schedule: str, pp: int, microbatches: int, virtual_stages: int = 1) -> dict[int, list[Action]]:
    """Every pipeline rank's order for one of the GENERATED schedules."""
    if pp < 1 or microbatches < 1 or virtual_stages < 1:
        raise ScheduleError(f"pp={pp}, micro-batches={microbatches} and virtual stages={virtual_stages} must be ≥ 1")
    if schedule == "gpipe":
        return gpipe_order(pp, microbatches)
    if schedule == "1f1b":
        return one_f_one_b_order(pp, microbatches)
    if schedule == "interleaved":
        return interleaved_order(pp, virtual_stages, microbatches)
    raise ScheduleError(f"the {schedule!r} schedule's order is not generated here: it is read from the order the "
                        f"trainer recorded beside the profile (known: {', '.join(GENERATED)})")


def orders_from_json(value: object) -> dict[int, list[Action]]:
    """``{"0": [["F", 0, 0], ["B", 0, 0], …], "1": …}`` (a recorded order's ``order``) as the simulator's input."""
    if not isinstance(value, dict) or not value:
        raise ScheduleError("a recorded order is an object of pipeline ranks to lists of [kind, stage, micro-batch]")
    orders: dict[int, list[Action]] = {}
    for key, actions in value.items():
        if not (isinstance(key, str) and key.isdigit()) or not isinstance(actions, list):
            raise ScheduleError(f"pipeline rank {key!r}: expected a rank number and a list of actions")
        order = []
        for item in actions:
            if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str)):
                raise ScheduleError(f"pipeline rank {key}: {item!r} is not [kind, stage, micro-batch]")
            order.append((item[0], item[1], item[2]))
        orders[int(key)] = order
    _checked(orders)
    return orders
