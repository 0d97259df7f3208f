"""Intake: everything that happens to groups received from the swarm, up to the ones a round trains on.

One round's intake (:meth:`Intake.take`), in order:

1. fetch candidate groups (the main process fetches for every process); stale ones are set aside unread; the records
   the transport refused or never got served since the last round (`SwarmTransport.refusals`) count against their
   senders' standing after this round's own verdicts, as groups refused here do (and every verdict is told to the
   transport, `SwarmTransport.judge`, which gives a sender judged good a share of its refills of its own);
2. sender standing: the groups of a benched sender are set aside unread (and the transport is told,
   `SwarmTransport.bench`, so that it fetches none of its records meanwhile);
3. re-derive the truth: the group's source re-derives the question and the reward columns (:mod:`sapo.sources`), and
   the prompt trained on is written here around it; a sender whose groups cost too much time to re-derive lately is
   rested, its groups set aside unread (:mod:`sapo.rederivation`);
4. hygiene: the group's size and every completion's text;
5. tokenize every completion once, as it is trained on (cut to the local `max_completion_length`, a sender's text read
   only that far), and score it with this peer's reward functions (through the :class:`sapo.probe.PolicyProbe`,
   TRL's own reward path): these are the tokens and rewards the round trains with; what steps 4 and 5 cost is charged
   to the sender beyond what is free (:func:`sapo.rederivation.scoring_excess`);
6. sample: the sampler chooses up to J of the scored candidates;
7. plausibility: chosen groups whose completions this policy would not write are dropped (:mod:`sapo.plausibility`)
   and their slots go to the next usable candidates; its reference is the node's own completions, handed in from the
   loss pass (:meth:`Intake.observe_loss_pass`). Tokens far below this policy's own get no weight in the loss
   (`SAPOConfig.external_token_floor`);
8. self-replay, when on (`SAPOConfig.replay`): slots still empty (or, under `"only"`, every slot, the swarm unread)
   are offered this peer's own earlier groups with reward spread (:mod:`sapo.replay`), already tokenized and scored,
   through steps 6 and 7 again.

It returns the chosen groups with their tokens, rewards and token weights, counts the reason for every drop
(`totals`, per sender in `sender_outcomes`) and writes every group judged to the group log (:mod:`sapo.group_log`),
all kept by its ledger (:mod:`sapo.intake_ledger`). With several processes, every process runs the same intake on the
main process's fetch and verdicts, so that all make the same choice; each then trains on an equal share of it.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch
from accelerate.utils import broadcast_object_list, gather_object

from sapo.config import SAPOConfig
from sapo.group_log import HELD, TAKEN, own_records
from sapo.hold import SwarmHold
from sapo.hygiene import CompletionFilter, CompletionHygiene
from sapo.intake_ledger import SUMMARY_ROUNDS, IntakeLedger, Taken
from sapo.plausibility import PlausibilityCheck, floor_mask
from sapo.probe import PolicyProbe
from sapo.questions import GroupDropped, question_of
from sapo.rederivation import RederivationCosts, RoundRederivation
from sapo.replay import ReplayBuffer
from sapo.round import weighted_rewards
from sapo.sampling import SWARM, Candidate, ExternalSampler, Selection, make_sampler
from sapo.sources import SourceRegistry
from sapo.standing import SenderStanding
from sapo.tally import SenderTally
from swarm.records import Group, ReceivedGroup
from swarm.transport import SwarmTransport

logger = logging.getLogger(__name__)


BAD_GROUP = frozenset({"hygiene", "question_mismatch", "bad_provenance", "untrusted_prompt"})
"""Drop reasons that judge a group bad (malformed, or false about its item): they count against its sender's standing,
as a group the plausibility check drops does. A group this peer cannot verify or use (an unknown source, an item not
held here, a version skew, a smaller group, a reward that fails on it) says nothing against its sender."""


class Intake:
    """Takes the external groups of each round for one node (see the module docstring for the steps).

    Args:
        args: the trainer's configuration (trust, sampling and plausibility settings).
        swarm: the transport to fetch from (`None` on the processes other than the main one).
        uses_swarm: whether the node has a swarm (the main process's answer, the same on every process).
        peer_id: the node's peer id (its own groups are never taken).
        accelerator: the trainer's `accelerate.Accelerator` (processes, main process, device).
        reward_weights: the weight of each reward function in a completion's reward (TRL's `reward_weights`).
        system_messages: this node's own system messages, written around every external question.
        sampler, completion_filter: as `SAPOTrainer` takes them; default from `args`.
        sources: the task sources this peer holds (`sapo.sources.SourceRegistry`); default: none, under
            `args.external_source_policy`.
    """

    def __init__(
        self,
        args: SAPOConfig,
        swarm: SwarmTransport | None,
        uses_swarm: bool,
        peer_id: str | None,
        accelerator: Any,
        reward_weights: torch.Tensor,
        system_messages: Sequence[dict[str, str]] = (),
        sampler: ExternalSampler | None = None,
        sources: SourceRegistry | None = None,
        completion_filter: CompletionFilter | None = None,
    ):
        self.args, self.swarm, self.uses_swarm, self.accelerator = args, swarm, uses_swarm, accelerator
        self.reward_weights = reward_weights.detach().float().cpu()
        self.system_messages = [dict(m) for m in system_messages]
        self.sources = sources or SourceRegistry(policy=args.external_source_policy)
        self.hygiene = CompletionHygiene(
            max_chars=args.completion_max_chars,
            forbid_control_chars=args.completion_forbid_control_chars,
            max_non_ascii_fraction=args.completion_max_non_ascii_fraction,
            forbidden_patterns=tuple(args.completion_forbidden_patterns),
            extra_filter=completion_filter,
        )
        self.standing = (
            SenderStanding(args.sender_drop_limit, args.sender_window, args.sender_bench_seconds)
            if args.sender_drop_limit is not None
            else None
        )
        # the main process re-derives for every process; what each sender's groups cost is kept there
        costs, newcomers = args.sender_rederivation_seconds, args.newcomer_rederivation_seconds
        self.rederivation = RoundRederivation(
            self.sources,
            RederivationCosts(costs) if costs is not None else None,
            self.standing,
            RederivationCosts(newcomers) if newcomers is not None else None,
        )
        self.plausibility = (
            PlausibilityCheck(
                args.plausibility_margin,
                args.plausibility_window,
                span_margin=args.plausibility_span_margin,
                span_tokens=args.plausibility_span_tokens,
            )
            if args.plausibility_margin is not None and (uses_swarm or args.replay != "off")
            else None
        )
        # this peer's own groups with reward spread, offered to the external slots (`SAPOConfig.replay`)
        self.replay = ReplayBuffer(args.replay_max_age, args.replay_max_uses) if args.replay != "off" else None
        # usable received groups the sampler left unchosen, offered again in later rounds (`SAPOConfig.swarm_hold`)
        self.hold = SwarmHold(args.swarm_hold)
        self.sampler = sampler or make_sampler(
            args.sampling_strategy,
            max_groups_per_peer=args.max_groups_per_peer,
            max_group_age=args.max_group_age,
            self_id=peer_id,
            config=args,  # the strategy's own options: the fields its class declares (`config_fields`)
        )
        self.rng = random.Random(args.seed)  # the same on every process, so they make the same selection
        self.peer_id = peer_id
        # the counts (logged as sapo/total/<name>), the outcomes per sender and the group log
        self.ledger = IntakeLedger(args, accelerator.is_main_process)
        self._rounds = 0  # rounds with a swarm, for the periodic summary
        self._refusals: list[tuple[str, str]] = []  # the transport's, taken with this round's fetch

    # ------------------------------------------------------------------------------------------------
    # one round

    def take(
        self,
        slots: int,
        probe: PolicyProbe,
        timed: Callable[[str], Any] = lambda phase: contextlib.nullcontext(),
        step: int = 0,
    ) -> Taken:
        """The external groups for ``slots`` group slots of every process: fetched, judged, tokenized and scored once
        through ``probe``, sampled and checked for plausibility under the policy ``probe`` reads; then, with
        self-replay on, this peer's own earlier groups for the slots left (`SAPOConfig.replay`). ``timed(phase)``
        wraps each phase (`swarm_fetch`, `external_scoring`, `plausibility`); ``step`` is the node's step, for the
        group log and the replay's age bound. Every process calls it, in step."""
        processes = self.accelerator.num_processes
        self.ledger.step = step
        self.hold.new_round()
        wanted = slots * processes
        from_swarm = self.uses_swarm and self.args.replay != "only"
        if slots == 0 or not (from_swarm or self.replay is not None):
            self.totals["fill_ins"] += wanted
            return Taken()
        taken = Taken()
        chosen: list[Candidate] = []
        unused: list[Candidate] = []
        if self._plausibility_ready():  # else the groups wait (in the swarm, in the replay) until they can be judged
            if from_swarm:
                chosen, unused = self._from_swarm(wanted, probe, timed, taken)
            if self.replay is not None and len(chosen) < wanted:
                replayed, left = self._from_replay(wanted - len(chosen), probe, timed, taken)
                chosen, unused = [*chosen, *replayed], [*unused, *left]
        for candidate in chosen:
            if candidate.origin == SWARM:
                if id(candidate) not in taken.contested:
                    self._record_standing(candidate.sender, True, time.time())
                self._mask_after_answer(candidate)
        self._count_refusals()
        # An equal share for every process (each trains on the same number of own rows); a remainder is filled in.
        per_process = len(chosen) // processes
        taken.chosen = chosen[: per_process * processes]
        rank = self.accelerator.process_index
        taken.share = taken.chosen[rank * per_process : (rank + 1) * per_process]
        received = [c for c in taken.chosen if c.origin == SWARM]
        self.totals["held_taken"] += sum(map(self.hold.was_offered, received))
        if self.replay is not None:
            self.replay.taken(taken.chosen)
        self.totals["external_groups"] += len(received)
        self.totals["replay_groups"] += len(taken.chosen) - len(received)
        self.totals["external_truncated"] += sum(t.truncated for c in received for t in c.tokenized)
        self.totals["fill_ins"] += wanted - len(taken.chosen)
        for candidate in received:
            self.sender_outcomes.count(candidate.sender, "taken")
        taken.records += [self.ledger.candidate_record(c, TAKEN) for c in taken.chosen]
        left = [*chosen[len(taken.chosen) :], *unused]
        held = {id(c) for c in self.hold.keep(left, time.time())}
        # chosen (trained on, or left over by the processes' equal shares): the sender pays nothing for it; held (the
        # hold as it is now, kept this round or from before): paid for if it leaves the hold unused
        self.rederivation.settle({id(c.group) for c in chosen}, {id(c.group) for c in self.hold.groups})
        taken.records += [self.ledger.candidate_record(c, HELD if id(c) in held else "not_chosen") for c in left]
        self.ledger.write(taken.records)
        self._rounds += 1
        if self._rounds % SUMMARY_ROUNDS == 0:
            self.ledger.log_summary(self._rounds)
        return taken

    def _from_swarm(
        self, k: int, probe: PolicyProbe, timed: Callable[[str], Any], taken: Taken
    ) -> tuple[list[Candidate], list[Candidate]]:
        """Up to ``k`` received groups for this round, and the usable ones left over (fetched, judged, scored,
        sampled, checked for plausibility)."""
        pool_size = self.args.external_pool_size or 4 * self.args.num_external
        with timed("swarm_fetch"):
            received, fetched_at, self._refusals = self._fetch(pool_size)
        fresh = []
        for item in received:  # stale groups are set aside before scoring: they cost nothing
            if self.sampler.is_stale(item.group, fetched_at):
                self.ledger.count(taken, "stale")
                taken.records.append(self.ledger.record(item.sender, item.group, "stale"))
            else:
                fresh.append(item)
        with timed("external_scoring"):
            readable = [item for item in fresh if not self._benched(item.sender, fetched_at)]  # benched: unread
            truths = dict(zip(map(id, readable), self._truths(readable), strict=True))
            judged = [
                self._judge(item.sender, item.group, truths.get(id(item)), fetched_at, probe, taken) for item in fresh
            ]
            self.rederivation.charge_scoring(taken.scoring_seconds)
        candidates = [c for c in judged if c is not None]
        taken.candidates, taken.scored = len(received), len(candidates)
        taken.zero_advantage = sum(c.has_zero_advantage for c in candidates)
        self.totals["candidates"] += taken.candidates
        self.totals["zero_advantage_candidates"] += taken.zero_advantage
        pool = self._distinct([*candidates, *self._offer_held(taken, fetched_at)], taken)
        return self._choose(pool, k, probe, timed, taken, fetched_at)

    def _distinct(self, candidates: list[Candidate], taken: Taken) -> list[Candidate]:
        """``candidates`` with each repeat of a group already among them set aside as ``duplicate`` (the same question
        and the same tokens trained on, whatever its id or sender): one group re-sent under new ids, or another
        peer's copied, took several slots of a batch and counted k times in its loss. Never against a sender: the
        first to arrive is kept, and it need not be the original, so one another sender sent too earns its sender no
        standing (``taken.contested``): a copier of honest groups whose copies came first earned the standing of the
        groups it copied."""
        kept: dict[tuple[Any, ...], Candidate] = {}
        for candidate in candidates:
            content = (question_of(candidate.group.prompt), *(t.ids for t in candidate.tokenized))
            first = kept.get(content)
            if first is not None:
                if first.sender != candidate.sender:
                    taken.contested.add(id(first))
                self._set_aside(candidate, "duplicate", taken)
                continue
            kept[content] = candidate
        return list(kept.values())

    def _set_aside(self, candidate: Candidate, reason: str, taken: Taken) -> None:
        """A scored candidate set aside for ``reason``: counted (for a received one, in its sender's outcomes too)
        and logged in the round's records."""
        self.ledger.count(taken, reason)
        if candidate.origin == SWARM:
            self.sender_outcomes.count(candidate.sender, f"dropped/{reason}")
        taken.records.append(self.ledger.candidate_record(candidate, reason))

    def _offer_held(self, taken: Taken, now: float) -> list[Candidate]:
        """The groups held from earlier rounds (:mod:`sapo.hold`), offered to this round's sampler beside the fetched
        ones (it sets a stale one aside); a sender benched since has its held groups set aside unread."""
        offered: list[Candidate] = []
        for candidate in self.hold.offer():
            if self._benched(candidate.sender, now):
                self.ledger.drop(taken, "benched_sender", candidate.sender, candidate.group, "benched while held")
            else:
                offered.append(candidate)
        self.totals["held_offered"] += len(offered)
        return offered

    def _from_replay(
        self, k: int, probe: PolicyProbe, timed: Callable[[str], Any], taken: Taken
    ) -> tuple[list[Candidate], list[Candidate]]:
        """Up to ``k`` of this peer's own earlier groups (`sapo.replay`), and the usable ones left over: already
        tokenized and scored, they are sampled and checked for plausibility as received groups are."""
        offered = self.replay.offer(self.ledger.step)
        self.totals["replay_offered"] += len(offered)
        return self._choose(offered, k, probe, timed, taken, time.time())

    def _choose(
        self,
        candidates: list[Candidate],
        k: int,
        probe: PolicyProbe,
        timed: Callable[[str], Any],
        taken: Taken,
        now: float,
    ) -> tuple[list[Candidate], list[Candidate]]:
        """The sampler's choice of up to ``k`` of ``candidates`` that pass the plausibility check, and its reserve."""
        selection = self.sampler.select(candidates, k, self.rng, now=now)
        for candidate, reason in selection.set_aside:
            self._set_aside(candidate, reason, taken)
        return self._keep_plausible(selection, probe, timed, taken), selection.reserve

    def _fetch(self, pool_size: int) -> tuple[list[Any], float, list[tuple[str, str]]]:
        """Candidates from the swarm, the time they were fetched and the transport's refusals since the last fetch:
        the main process's, on every process."""
        if self.accelerator.num_processes == 1:
            return self.swarm.fetch(pool_size), time.time(), self.swarm.refusals()
        fetched = [None]
        if self.accelerator.is_main_process:
            fetched = [(self.swarm.fetch(pool_size), time.time(), self.swarm.refusals())]
        return broadcast_object_list(fetched, from_process=0)[0]

    def _truths(self, received: list[ReceivedGroup]) -> list[dict[str, Any] | GroupDropped]:
        """What the sources re-derive of each of ``received``, in their order (:class:`RoundRederivation`). With
        several processes the main process asks and every process takes its answers: a time-bounded re-derivation
        may end otherwise on another process, and all must judge alike."""
        truths: list[dict[str, Any] | GroupDropped | None] = [None] * len(received)
        if self.accelerator.is_main_process:
            truths = self.rederivation.truths(received)
        if self.accelerator.num_processes > 1:
            truths = broadcast_object_list([truths], from_process=0)[0]
        return truths

    def _judge(
        self,
        sender: str,
        group: Group,
        truth: dict[str, Any] | GroupDropped | None,
        now: float,
        probe: PolicyProbe,
        taken: Taken,
    ) -> Candidate | None:
        """A candidate, or None: a benched sender's group is set aside unread; one judged bad here (:data:`BAD_GROUP`)
        counts as a drop in its sender's standing, one this peer merely cannot verify or use does not (a candidate
        counts once the sampler chose it and the plausibility check judged it: a usable group the sampler leaves
        unchosen says nothing of its sender; the transport never returns it again, so it is logged `held` when kept for
        a later round (`SAPOConfig.swarm_hold`), else `not_chosen`)."""
        if self._benched(sender, now):
            self.ledger.drop(taken, "benched_sender", sender, group, "its recent groups kept being dropped")
            return None
        candidate, reason = self._verify_and_score(sender, group, truth, probe, taken)
        if reason in BAD_GROUP:
            self._record_standing(sender, False, now)
        return candidate

    def _verify_and_score(
        self, sender: str, group: Group, truth: dict[str, Any] | GroupDropped, probe: PolicyProbe, taken: Taken
    ) -> tuple[Candidate | None, str | None]:
        """A candidate with this peer's ground truth (``truth``: the columns its source re-derived, or why it could
        not) and rewards, or None and the reason it was dropped (counted)."""
        if isinstance(truth, GroupDropped):
            self.ledger.drop(taken, truth.reason, sender, group, truth.detail)
            return None, truth.reason
        columns = dict(truth)
        limit = self.args.external_max_question_chars
        if limit is not None and len(columns["question"]) > limit:  # the prompt trained on is this question
            self.ledger.drop(taken, "question_too_long", sender, group, f"{len(columns['question'])} > {limit} chars")
            return None, "question_too_long"
        size = self.args.num_generations
        if len(group.completions) < size:
            self.ledger.drop(taken, "group_size", sender, group, f"{len(group.completions)} < {size} completions")
            return None, "group_size"
        started = time.monotonic()
        try:
            return self._tokenize_and_score(sender, group, columns, probe, taken)
        finally:  # what the sender's text made this peer spend (`RoundRederivation.charge_scoring`)
            taken.scoring_seconds.append((sender, time.monotonic() - started))

    def _tokenize_and_score(
        self, sender: str, group: Group, columns: dict[str, Any], probe: PolicyProbe, taken: Taken
    ) -> tuple[Candidate | None, str | None]:
        """The candidate of a group whose truth is known: its first `num_generations` completions judged by hygiene,
        tokenized as they are trained on (cut to the local limit, read only that far) and scored with this peer's
        rewards around the verified question; or None and why it was dropped (counted)."""
        completions = list(group.completions[: self.args.num_generations])
        problem = self.hygiene.group_problem(completions)
        if problem is not None:
            self.ledger.drop(taken, "hygiene", sender, group, problem)
            return None, "hygiene"
        tokenized = [probe.tokenize(text) for text in completions]
        # Only completions cross the trust boundary: the prompt trained on (and scored) is written here, around the
        # question this node verified; the sender's prompt was only compared, never used.
        prompt = [*self.system_messages, {"role": "user", "content": columns.pop("question")}]
        group = Group(**{**vars(group), "completions": completions, "prompt": prompt})
        try:
            per_function = probe.score(prompt, tokenized, columns).detach().cpu()
        except Exception as e:  # a reward function choking on foreign text must not stop training
            self.ledger.drop(taken, "reward_error", sender, group, f"{type(e).__name__}: {e}")
            return None, "reward_error"
        rewards = weighted_rewards(per_function, self.reward_weights).tolist()
        return Candidate(sender, group, rewards, columns, per_function.tolist(), tokenized), None

    # ------------------------------------------------------------------------------------------------
    # plausibility

    def _plausibility_ready(self) -> bool:
        """False while the plausibility check has no reference yet (before the node's first own round was trained
        on): the swarm's groups are then left where they are, to be taken once they can be judged."""
        if self.plausibility is None:
            return True
        ready = [self.plausibility.threshold() is not None]
        if self.accelerator.num_processes > 1:  # the main process holds the reference that judges
            ready = broadcast_object_list(ready, from_process=0)
        if not ready[0]:
            logger.info("this step trains on own groups only: the plausibility check needs them as its reference")
        return ready[0]

    def _keep_plausible(
        self, selection: Selection, probe: PolicyProbe, timed: Callable[[str], Any], taken: Taken
    ) -> list[Candidate]:
        """The chosen groups whose every completion is plausible under this policy. A group found implausible is
        counted as dropped (`implausible`) and its slot goes to the next usable candidate the sampler ranked
        (`Selection.reserve`), judged the same way, before the slot falls back to an own group. The main process
        judges (it holds the reference); every process takes its verdicts."""
        if self.plausibility is None:
            return list(selection.chosen)
        kept: list[Candidate] = []
        pending = list(selection.chosen)
        while pending:
            dropped = 0
            verdicts = self._plausibility_verdicts(pending, probe, timed)
            for candidate, (problem, weights) in zip(pending, verdicts, strict=True):
                if problem is None:
                    candidate.token_weights = weights
                    kept.append(candidate)
                    continue
                dropped += 1
                selection.chosen.remove(candidate)
                self.ledger.drop(taken, "implausible", candidate.sender, candidate.group, problem, candidate.rewards,
                           candidate.origin)  # fmt: skip
                self.totals[f"implausible/{problem.test}"] += 1  # which test dropped it: what calibrating needs
                if candidate.origin == SWARM:
                    self._record_standing(candidate.sender, False, time.time())
            pending = [c for c in (self._refill(selection, taken) for _ in range(dropped)) if c is not None]
            self.totals["refilled_slots"] += len(pending)
        return kept

    def _refill(self, selection: Selection, taken: Taken) -> Candidate | None:
        """The next usable candidate of the sampler's reserve for a slot whose group was dropped, or None: a sender
        benched meanwhile (by this round's verdicts) has its reserve groups set aside unread."""
        while (candidate := selection.next_from_reserve(self.sampler.max_groups_per_peer)) is not None:
            if not self._benched(candidate.sender, time.time()):
                return candidate
            selection.chosen.remove(candidate)
            self.ledger.drop(taken, "benched_sender", candidate.sender, candidate.group, "benched during this round")
        return None

    def _plausibility_verdicts(
        self, groups: list[Candidate], probe: PolicyProbe, timed: Callable[[str], Any]
    ) -> list[tuple[Any, list[list[int]] | None]]:
        """Per group, the plausibility check's problem (None for a plausible group) and its token weights (None:
        every token): the main process's verdicts (it holds the reference), on every process."""
        verdicts: list[Any] = [None]
        if self.accelerator.is_main_process:
            with timed("plausibility"):
                scores = probe.typicality(groups)
            size, found = self.args.num_generations, []
            for i in range(len(groups)):
                group_scores = scores[i * size : (i + 1) * size]
                problem = self.plausibility.group_problem([s.statistics for s in group_scores])
                found.append((problem, self._token_weights(group_scores) if problem is None else None))
            verdicts = [found]
        if self.accelerator.num_processes > 1:
            verdicts = broadcast_object_list(verdicts, from_process=0)
        return verdicts[0]

    def _token_weights(self, scores: list[Any]) -> list[list[int]] | None:
        """Per completion, 1 for each token trained on, 0 for each token whose typicality lies below
        `external_token_floor` or within `external_token_floor_before` / `external_token_floor_after` tokens of one
        that does (so a payload that passed the check is not learned); None with the floor off."""
        args = self.args
        if args.external_token_floor is None:
            return None
        weights = [floor_mask(s.tokens, args.external_token_floor, args.external_token_floor_before,
                              args.external_token_floor_after) for s in scores]  # fmt: skip
        self.totals["external_tokens"] += sum(len(w) for w in weights)
        self.totals["external_tokens_masked"] += sum(len(w) - sum(w) for w in weights)
        return weights

    def _mask_after_answer(self, candidate: Candidate) -> None:
        """No weight in the loss for the tokens of a received completion after its final answer's end
        (`SAPOConfig.external_answer_end`, found when it was tokenized), EOS included: text there earns this peer no
        reward, so it must not ride on the completion's advantage."""
        if not any(t.answer_tokens is not None for t in candidate.tokenized):
            return
        weights = candidate.token_weights or [[1] * len(t.ids) for t in candidate.tokenized]
        for completion, (tokens, row) in enumerate(zip(candidate.tokenized, weights, strict=True)):
            if tokens.answer_tokens is None:
                continue
            after = len(row) - min(tokens.answer_tokens, len(row))
            self.totals["external_tokens_after_answer"] += sum(row[tokens.answer_tokens :])
            weights[completion] = row[: tokens.answer_tokens] + [0] * after
        candidate.token_weights = weights

    def observe_loss_pass(
        self, logps: torch.Tensor, entropies: torch.Tensor, mask: torch.Tensor, is_external: torch.Tensor | None
    ) -> None:
        """Add the plausibility statistics of the node's own completions in a loss pass to the reference: they come
        free, since the loss computes their log-probabilities and entropies anyway. Rows (tensors of shape (rows,
        tokens)) that ``is_external`` marks, and fully masked rows, are left out."""
        if self.plausibility is None:
            return
        own = mask.any(dim=1).cpu()
        if is_external is not None:
            own &= ~is_external.bool().cpu()
        if own.any():
            self.plausibility.add_own(self.plausibility.statistics(logps[own], entropies[own], mask[own]))

    # ------------------------------------------------------------------------------------------------
    # counts (kept by the ledger, `sapo.intake_ledger`)

    @property
    def totals(self) -> Counter[str]:
        """Cumulative counts, logged as `sapo/total/<name>`."""
        return self.ledger.totals

    @property
    def sender_outcomes(self) -> SenderTally:
        """Per sender: "taken", "dropped/<reason>" and "refused/<reason>" counts (`sapo.tally.SenderTally`)."""
        return self.ledger.sender_outcomes

    @property
    def taken_from(self) -> Counter[str]:
        """External groups trained on, by verified sender (`sender_outcomes`' "taken" counts)."""
        return self.ledger.taken_from

    def running_totals(self) -> dict[str, Any]:
        """The cumulative counts as JSON-ready mappings, what a checkpoint keeps (`IntakeLedger.running_totals`)."""
        return self.ledger.running_totals()

    def restore_totals(self, saved: dict[str, Any]) -> None:
        """Count on from ``saved`` (:meth:`running_totals` of the run being resumed)."""
        self.ledger.restore_totals(saved)

    def _count_refusals(self) -> None:
        """The records the transport refused or never got served (taken with this round's fetch): each is a drop in
        its sender's standing, counted as `transport_refusals` and per sender as `refused/<reason>`. They count after
        the round's own verdicts, so a sender's groups already fetched are judged on what they are first."""
        refusals, self._refusals = self._refusals, []
        now = time.time()
        for sender, reason in refusals:
            self.totals["transport_refusals"] += 1
            self.sender_outcomes.count(sender, f"refused/{reason}")
            self._record_standing(sender, False, now, tell_transport=False)  # the transport counted it already

    def _benched(self, sender: str, now: float) -> bool:
        """Whether ``sender`` is benched at ``now`` (never with standing off)."""
        return self.standing is not None and self.standing.is_benched(sender, now)

    def _record_standing(self, sender: str, usable: bool, now: float, tell_transport: bool = True) -> None:
        """Note one outcome of a sender's group in its standing (if standing is on), and tell the transport (the main
        process's) so that its refills follow the node's verdicts; log when that benches it, and tell the transport
        too, so that it fetches none of the sender's records while they would be set aside unread."""
        if tell_transport and self.swarm is not None:
            self.swarm.judge(sender, usable)
        seconds = None if self.standing is None else self.standing.record(sender, usable, now)
        if seconds is None:
            return
        if self.swarm is not None:
            self.swarm.bench(sender, seconds)
        self.totals["benched_senders"] += 1
        logger.warning(
            "benched the sender with key fingerprint %s for %.0f s: %d of its last %d groups were dropped",
            sender, seconds, self.standing.drop_limit, self.standing.window,
        )  # fmt: skip

    # ------------------------------------------------------------------------------------------------
    # the group log

    def remember_own(self, candidates: Sequence[Candidate], step: int) -> None:
        """Keep the own groups of this process's round (`sapo.replay.own_candidates`) for self-replay, when it is on:
        every process's, on every process, so that all offer the same groups."""
        if self.replay is None:
            return
        if self.accelerator.num_processes > 1:
            candidates = gather_object(list(candidates))
        self.replay.add(candidates, step)

    def observe_own_groups(self, groups: Sequence[tuple[str, str, list[float]]], model: str = "") -> None:
        """Told once per round of this process's own groups, ``(group id, task, rewards)`` each, made by ``model``:
        the sampler and the rescue count learn which tasks this peer still fails on, and the groups are logged."""
        self.sampler.observe_own_groups((task, rewards) for _, task, rewards in groups)
        self.ledger.own_success.observe((task, rewards) for _, task, rewards in groups)
        if self.ledger.group_log is None and self.accelerator.num_processes == 1:
            return
        records = own_records(self.ledger.step, groups, self.peer_id or "self", model, self.args.success_threshold)
        if self.accelerator.num_processes > 1:
            records = gather_object(records)
        self.ledger.write(records)
