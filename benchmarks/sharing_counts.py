"""What sharing carried, counted from every node's group log (``groups.jsonl``): groups taken and from whom, drops by
reason, rescues, and the reward of what was taken.

A node writes one line per own group and per received group it judged (:mod:`sapo.group_log`). This module turns a
node's lines into flat counts (``{"taken": 31.0, "taken_from/node-1": 12.0, "dropped/zero_advantage": 40.0, ...}``)
that add up over nodes, seeds and settings, so that sapo_table's report, compute_report and campaign_report count
the same way:

- ``peer_steps``: the steps the node logged own groups at (the denominator of "per step");
- ``own_groups``, ``own_reward_sum`` (the sum over own groups of their mean reward under the node);
- ``judged``: received groups judged; ``taken``: those trained on, by sender (``taken_from/<node-i>``, named by each
  node's own lines) and by sender model (``taken_model/<name>``); ``taken_reward_sum``, ``taken_success``,
  ``taken_spread``: their mean reward under the receiver (summed), and how many held a success or reward spread;
- ``dropped/<reason>``: received groups set aside, by the reason the node logged; ``held_lines``: lines of usable
  groups a node with ``swarm_hold`` kept for a later round, where the group is judged again (counted there, not here);
- ``rescues``: taken groups the node flagged as rescues (a success on a task where its own last ``success_window``
  groups of that task had none); ``rescues_recounted``: the same recomputed from the lines (own groups' successes
  per task in a window of :data:`RESCUE_WINDOW`, emptied where the node restarted), a check of the flag;
  ``rescues_task/<task>``: the flagged rescues by task;
- ``usable``: received groups scored with reward spread (what the paper's sampler may choose), and
  ``steps_with_surplus``: the steps at which more of them arrived than the node had swarm slots (``slots``);
- ``taken_origin/<origin>``: taken groups by where they came from (``swarm``, or ``replay``: the node's own earlier
  groups), ``lag_sum/<origin>`` their step lags summed; ``fill_ins``: own groups beyond the node's ``local`` a step
  (slots that neither the swarm nor the replay filled, generated here);
- ``fill_ins_held_could_take``: of those fill-ins, how many a usable swarm group the sampler left unchosen at an
  earlier step could have taken, had the node held such groups (at most :data:`HELD_GROUPS`, each until it is older
  than :data:`HELD_MAX_AGE` seconds, the node's default ``max_group_age``) instead of dropping them. Read from the
  logs of a run that dropped them, so an upper bound: a held group would still face this policy's plausibility check,
  and the run would have trained on other groups from then on.

A node that restarts from a checkpoint repeats the steps after it; the repeated steps' first lines describe training
that was rolled back, so only the last attempt at each step counts (a restart shows as a step lower than the one
before it).
"""

from __future__ import annotations

import json
import math
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.results_archive import restored
from sapo.group_log import HELD, OWN, TAKEN, read_group_log

GROUP_LOG = "groups.jsonl"
RESCUE_WINDOW = 8  # a node's default success_window: own groups of a task remembered
HELD_GROUPS, HELD_MAX_AGE = 4, 600.0  # the counterfactual hold: a node's default pool of 4 x J (J = 1), max_group_age


def attempts(records: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The lines split where the node restarted (a step lower than the line before)."""
    out: list[list[dict[str, Any]]] = []
    for record in records:
        if not out or record["step"] < out[-1][-1]["step"]:
            out.append([])
        out[-1].append(record)
    return out


def recount_rescues(records: Sequence[dict[str, Any]], window: int = RESCUE_WINDOW) -> list[bool]:
    """For each line, whether it is a rescue as the node judges one: a taken group with a success on a task where
    none of the node's last ``window`` own groups of that task (since its last restart) had a success."""
    flags = []
    for attempt in attempts(records):
        recent: dict[str, deque[bool]] = {}
        for record in attempt:
            task = record.get("task", "")
            if record["origin"] == OWN:
                recent.setdefault(task, deque(maxlen=window)).append(bool(record.get("success")))
            flags.append(record["outcome"] == TAKEN and bool(record.get("success")) and not any(recent.get(task, ())))
    return flags


def last_attempts(records: Sequence[dict[str, Any]]) -> list[int]:
    """The positions of the lines that count: for each step, those of the node's last attempt at it."""
    kept: list[int] = []
    position = 0
    for attempt in attempts(records):
        first = attempt[0]["step"]
        kept = [i for i in kept if records[i]["step"] < first] + list(range(position, position + len(attempt)))
        position += len(attempt)
    return kept


def mean_reward(rewards: Sequence[float | None] | None) -> float:
    """The mean of a group's rewards (null rewards left out; NaN when none)."""
    finite = [r for r in rewards or () if r is not None and not math.isnan(r)]
    return sum(finite) / len(finite) if finite else math.nan


def node_counts(
    records: Sequence[dict[str, Any]], names: dict[str, str], slots: int | None = None, local: int | None = None
) -> Counter:
    """The counts of one node's lines (module docstring); ``names`` maps a sender to a node name, ``slots`` is the
    node's swarm slots per step (None: no surplus count), ``local`` its own groups a step (None: no fill-in count)."""
    rescued = recount_rescues(records)
    counts: Counter = Counter()
    usable_by_step: Counter = Counter()
    steps = set()
    counted = last_attempts(records)
    for i in counted:
        record = records[i]
        reward = mean_reward(record.get("rewards"))
        if record["origin"] == OWN:
            steps.add(record["step"])
            counts["own_groups"] += 1
            counts["own_reward_sum"] += 0.0 if math.isnan(reward) else reward
            continue
        if record["outcome"] == HELD:  # kept for a later round (`swarm_hold`): judged there, taken or set aside
            counts["held_lines"] += 1
            continue
        counts["judged"] += 1
        if record.get("spread"):
            counts["usable"] += 1
            usable_by_step[record["step"]] += 1
        if record["outcome"] != TAKEN:
            counts[f"dropped/{record['outcome']}"] += 1
            continue
        sender = record.get("sender", "")
        counts["taken"] += 1
        counts[f"taken_origin/{record['origin']}"] += 1
        counts[f"lag_sum/{record['origin']}"] += record.get("step_lag") or 0
        counts[f"taken_from/{names.get(sender, f'peer {sender[:12]}')}"] += 1
        counts[f"taken_model/{Path(record.get('model') or '?').name}"] += 1
        counts["taken_reward_sum"] += 0.0 if math.isnan(reward) else reward
        counts["taken_success"] += bool(record.get("success"))
        counts["taken_spread"] += bool(record.get("spread"))
        if record.get("rescue"):
            counts["rescues"] += 1
            counts[f"rescues_task/{record.get('task', '')}"] += 1
        counts["rescues_recounted"] += rescued[i]
    counts["peer_steps"] = len(steps)
    if slots is not None:
        counts["steps_with_surplus"] = sum(1 for step in steps if usable_by_step[step] > slots)
    if local is not None:
        counts["fill_ins"] = counts["own_groups"] - local * len(steps)
        counts["fill_ins_held_could_take"] = held_could_fill([records[i] for i in counted], local)
    return counts


def held_could_fill(records: Sequence[dict[str, Any]], local: int) -> int:
    """How many of a node's fill-ins a usable swarm group left unchosen at an earlier step could have taken, had the
    node held the newest :data:`HELD_GROUPS` of them until they were older than :data:`HELD_MAX_AGE` (module
    docstring). ``records``: the node's lines that count, in step order."""
    by_step: dict[int, list[dict[str, Any]]] = {}
    for record in records:
        by_step.setdefault(record["step"], []).append(record)
    held: deque[float] = deque(maxlen=HELD_GROUPS)  # creation times of the held groups, oldest first
    filled = 0
    for step in sorted(by_step):
        lines = by_step[step]
        now = max(float(r.get("time") or 0.0) for r in lines)
        while held and now - held[0] > HELD_MAX_AGE:
            held.popleft()
        fill_ins = sum(r["origin"] == OWN for r in lines) - local
        while fill_ins > 0 and held:
            held.pop()  # the freshest held group takes the slot
            fill_ins, filled = fill_ins - 1, filled + 1
        for r in lines:
            if r["origin"] == "swarm" and r["outcome"] == "not_chosen" and r.get("spread"):
                held.append(float(r.get("time") or 0.0) - float(r.get("age_seconds") or 0.0))
    return filled


def node_dirs(run_dir: Path) -> list[Path]:
    """A run's node folders (``node-0``, ``node-1``, ...), in node order."""
    nodes = [path for path in run_dir.glob("node-*") if path.is_dir() and path.name[5:].isdigit()]
    return sorted(nodes, key=lambda path: int(path.name[5:]))


def peer_names(logs: dict[str, list[dict[str, Any]]]) -> dict[str, str]:
    """Sender name -> node name, from each node's own lines (a node publishes under the name it logs them with)."""
    return {record["sender"]: node for node, records in logs.items() for record in records if record["origin"] == OWN}


def counts_by_node(run_dir: Path) -> dict[str, Counter]:
    """The counts of each node of a run that wrote a group log, by node name (senders named by each node's own
    lines); a node's swarm slots come from its ``node-run.json`` where the run kept it."""
    run_dir = restored(run_dir)  # group logs packed into results/archive are read from there
    logs = {path.name: read_group_log(path / GROUP_LOG) for path in node_dirs(run_dir)}
    names = peer_names(logs)
    return {node: node_counts(records, names, node_slots(run_dir / node), node_slots(run_dir / node, "num_local"))
            for node, records in logs.items() if records}  # fmt: skip


def run_counts(run_dir: Path, nodes: Iterable[int] | None = None) -> Counter:
    """The counts of a run's nodes (``nodes``: their indices; None: every node), summed; empty where no node wrote a
    group log."""
    chosen = None if nodes is None else {f"node-{i}" for i in nodes}
    total: Counter = Counter()
    for node, counts in counts_by_node(run_dir).items():
        if chosen is None or node in chosen:
            total.update(counts)
    return total


def node_slots(node_dir: Path, key: str = "num_external") -> int | None:
    """The node's swarm slots per step (``num_external`` in its node-run.json; ``key="num_local"``: its own groups),
    or None where it is not recorded."""
    try:
        return int(json.loads((node_dir / "node-run.json").read_text())[key])
    except (FileNotFoundError, KeyError, TypeError, ValueError):
        return None


def _share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f} %" if whole else "-"


def _breakdown(counts: Counter, prefix: str) -> str:
    items = sorted(
        ((k.removeprefix(prefix), v) for k, v in counts.items() if k.startswith(prefix)), key=lambda x: -x[1]
    )
    return ", ".join(f"{name} {value:.0f}" for name, value in items) or "-"


SHARING_HEADER = (
    "| setting | peer-steps | taken / peer-step | taken from | reward of taken (own groups) | taken with a success "
    "| rescues: logged / recounted (by task) | dropped, by reason | steps with more usable groups than slots |",
    "|---|---|---|---|---|---|---|---|---|",
)


def sharing_row(label: str, counts: Counter) -> str:
    """One markdown table row (:data:`SHARING_HEADER`) of a setting's counts."""
    steps, taken, own = counts["peer_steps"], counts["taken"], counts["own_groups"]
    taken_reward = f"{counts['taken_reward_sum'] / taken:.3f}" if taken else "-"
    own_reward = f"{counts['own_reward_sum'] / own:.3f}" if own else "-"
    surplus = _share(counts["steps_with_surplus"], steps) if "steps_with_surplus" in counts else "-"
    return (
        f"| {label} | {steps:.0f} | {taken / steps if steps else math.nan:.2f} | {_breakdown(counts, 'taken_from/')} | "
        f"{taken_reward} ({own_reward}) | {taken_success_text(counts)} | {counts['rescues']:.0f} / "
        f"{counts['rescues_recounted']:.0f} ({_breakdown(counts, 'rescues_task/')}) | "
        f"{_breakdown(counts, 'dropped/')} | {surplus} |"
    )


def taken_success_text(counts: Counter) -> str:
    """``"12 of 31 (39 %)"``: taken groups that held a success."""
    return (
        f"{counts['taken_success']:.0f} of {counts['taken']:.0f} ({_share(counts['taken_success'], counts['taken'])})"
    )


def sharing_lines(rows: Sequence[tuple[str, Counter]]) -> list[str]:
    """A markdown table of ``(setting, counts)`` rows, or a line saying no group log was found."""
    rows = [(label, counts) for label, counts in rows if counts]
    if not rows:
        return ["No node of these runs left a group log (groups.jsonl): nothing to count."]
    return [*SHARING_HEADER, *(sharing_row(label, counts) for label, counts in rows)]


SLOTS_HEADER = (
    "| arm | peer-steps | swarm groups taken / peer-step | replayed groups taken / peer-step | fill-ins / peer-step "
    "| reward of taken (own groups) | taken with a success | step lag of replayed groups (mean) "
    "| set aside, by reason | fill-ins a held unchosen swarm group could take |",
    "|---|---|---|---|---|---|---|---|---|---|",
)


def slots_lines(rows: Sequence[tuple[str, Counter]]) -> list[str]:
    """What filled the J slots, per arm (:data:`SLOTS_HEADER`): swarm groups, own replayed groups and fill-ins."""
    lines = list(SLOTS_HEADER)
    for label, counts in rows:
        steps, taken, replayed = counts["peer_steps"], counts["taken"], counts["taken_origin/replay"]
        per_step = [f"{counts[k] / steps:.2f}" if steps else "-" for k in ("taken_origin/swarm",
                    "taken_origin/replay", "fill_ins")]  # fmt: skip
        reward = f"{counts['taken_reward_sum'] / taken:.3f}" if taken else "-"
        own = f"{counts['own_reward_sum'] / counts['own_groups']:.3f}" if counts["own_groups"] else "-"
        lag = f"{counts['lag_sum/replay'] / replayed:.1f}" if replayed else "-"
        held = f"{counts['fill_ins_held_could_take']:.0f} of {counts['fill_ins']:.0f}" if counts["fill_ins"] else "-"
        lines.append(f"| {label} | {steps:.0f} | {' | '.join(per_step)} | {reward} ({own}) | "
                     f"{taken_success_text(counts)} | {lag} | {_breakdown(counts, 'dropped/')} | {held} |")  # fmt: skip
    return lines
