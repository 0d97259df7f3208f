"""SAPOTrainer: TRL's GRPOTrainer, training each round on its own groups plus groups taken from the swarm.

A round (one generation batch of TRL) holds `num_local + num_external` groups of `num_generations` rows each.
The SAPO round, read top to bottom in `_generate_and_score_completions`:

1. fetch candidate groups from the swarm; re-derive each one's ground truth and score it with this peer's reward
   functions, through TRL's own reward path (`_fetch_candidates`);
2. let the sampler choose up to J of them (`_select`);
3. put them into the last J group slots of the batch; slots left empty keep their local question (fill-in);
4. hand the batch to TRL: its `_generate` (a thin adapter here) generates only the local slots and re-tokenizes
   the external completions with this peer's tokenizer; TRL scores every row, normalizes advantages per group,
   and later computes the loss exactly as GRPOTrainer does;
5. publish the groups generated here, as text.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from accelerate.utils import broadcast_object_list, gather_object
from datasets import Dataset
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOTrainer
from trl.data_utils import is_conversational

from sapo.checkpoints import mark_complete
from sapo.config import SAPOConfig
from sapo.evaluation import HeldOutResult, evaluate_policy, held_out_questions
from sapo.hygiene import CompletionFilter, CompletionHygiene
from sapo.plausibility import CompletionStatistics, PlausibilityCheck
from sapo.sampling import Candidate, ExternalSampler, make_sampler
from sapo.standing import SenderStanding
from sapo.tasks import reasoning_gym_tasks_of
from sapo.verification import GroupDropped, QuestionVerifier, published_prompt
from swarm.records import Group, Provenance, RecordRejected, provenance_from_wire
from swarm.transport import SwarmTransport

logger = logging.getLogger(__name__)

SENDERS_FILE = "senders.json"
"""Written in `output_dir` at every checkpoint and at the end of training: per sending peer, its groups trained on
(`taken`) and dropped by this node (`dropped/<reason>`), for audits of who sent what."""

LOCAL_ROWS_KEY = "sapo_local_rows"
"""Key of the batch TRL trains on that marks this node's own rows (their log-probs feed the plausibility reference)."""

FAULT_PAUSE_BEFORE_MARKER = "SAPO_FAULT_PAUSE_BEFORE_MARKER"
"""Environment variable (seconds, for fault-injection tests): pause after a checkpoint's files are written and
before its completion marker, so that a kill in that window surely leaves a half-written checkpoint."""


@dataclass
class _Round:
    """What SAPO adds to one TRL generation batch: which rows are external, and what they contain."""

    rows: list[dict[str, Any]]
    external_text: dict[int, str] = field(default_factory=dict)  # row index -> completion text from the swarm
    senders: dict[int, str] = field(default_factory=dict)  # row index -> sending peer
    local_completions: dict[int, Any] = field(default_factory=dict)  # row index -> completion generated here
    rewards: torch.Tensor | None = None  # weighted reward per row, set when TRL scores the batch


class SAPOTrainer(GRPOTrainer):
    """GRPO on a mix of locally generated groups and groups sampled from a swarm of peers (SAPO).

    Everything `trl.GRPOTrainer` accepts is accepted here, plus:

    Args:
        swarm (`swarm.SwarmTransport` or `None`):
            Where groups are published and taken from (`swarm.dht.DHTTransport` for a real swarm,
            `swarm.MemorySwarm(...).join(...)` for tests and simulation). `None` trains alone: every slot is
            filled in locally and nothing is published.
        sampler (`sapo.sampling.ExternalSampler` or `None`):
            Chooses external groups among candidates; default built from `args.sampling_strategy`.
        verifier (`sapo.verification.QuestionVerifier` or `None`):
            Re-derives the ground truth of external groups; default built from `args.external_source_policy`
            and `args.regeneration_timeout`.
        completion_filter (`Callable[[str], str | None]` or `None`):
            A check of each received completion after `args`' completion hygiene: None lets it pass, a string
            says why not and drops its group (counted as `hygiene`).

    With several processes (`accelerate launch --num_processes N`), the node is one swarm peer: pass the swarm on
    the main process and `None` on the others. The main process fetches candidates for every process (each verifies
    and scores them identically, then takes its own share of one common selection) and publishes the groups of
    every process. `num_local` and `num_external` must then be multiples of N.

    Attributes:
        swarm_totals (`collections.Counter`): cumulative counts (external groups, fill-ins, drops by reason, ...),
            logged as `sapo/total/<name>`.
        taken_from (`collections.Counter`): external groups trained on, by verified sender.
        last_external (`list[sapo.sampling.Candidate]`): the external groups of the latest round, with the
            rewards this peer gave them.
    """

    def __init__(
        self,
        model: Any,
        reward_funcs: Any = None,
        args: SAPOConfig | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        *,
        swarm: SwarmTransport | None = None,
        sampler: ExternalSampler | None = None,
        verifier: QuestionVerifier | None = None,
        completion_filter: CompletionFilter | None = None,
        **kwargs: Any,
    ):
        if args is None:
            args = SAPOConfig(output_dir="sapo-output")
        if not isinstance(args, SAPOConfig):
            raise TypeError(f"SAPOTrainer needs args=SAPOConfig(...), got {type(args).__name__}.")
        if eval_dataset is None and args.eval_strategy != "no":
            eval_dataset = held_out_questions(train_dataset, args.eval_questions)
        super().__init__(
            model=model,
            reward_funcs=reward_funcs,
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            **kwargs,
        )
        if args.num_external > 0:
            self._check_external_support(train_dataset)
        self.swarm = swarm
        # Every process must agree on whether there is a swarm and on its peer id: they take part in the
        # main process's fetches and publications together, and make the same selection.
        self._uses_swarm, peer_id = self._main_process_swarm(swarm)
        self.verifier = verifier or QuestionVerifier(
            policy=args.external_source_policy, regeneration_timeout=args.regeneration_timeout
        )
        self._system_messages = _system_messages(train_dataset)  # this node's own, around every external question
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
        self.plausibility = (
            PlausibilityCheck(  # issue 23: the worst-span test beside the mean
                args.plausibility_margin,
                args.plausibility_window,
                span_margin=args.plausibility_span_margin,
                span_tokens=args.plausibility_span_tokens,
            )
            if args.plausibility_margin is not None and self._uses_swarm
            else None
        )
        self._loss_local_rows: torch.Tensor | None = None  # set while TRL's loss pass runs (see _compute_loss)
        self._register_local_copy(train_dataset)
        self.sampler = sampler or make_sampler(
            args.sampling_strategy,
            max_groups_per_peer=args.max_groups_per_peer,
            max_group_age=args.max_group_age,
            self_id=peer_id,
        )
        self.swarm_model_name = args.swarm_model_name or str(getattr(self.model.config, "_name_or_path", "") or "")
        self._rng = random.Random(args.seed)  # the same on every process, so they make the same selection
        self._round: _Round | None = None
        self._phase_seconds: Counter[str] = Counter()
        self.swarm_totals: Counter[str] = Counter()  # cumulative counts, logged as sapo/total/<name>
        self.taken_from: Counter[str] = Counter()  # external groups trained on, by verified sender
        self.sender_outcomes: dict[str, Counter[str]] = {}  # per sender: "taken" and "dropped/<reason>" counts
        self.last_external: list[Candidate] = []  # the external groups of the latest round, as scored here
        self.last_evaluation: HeldOutResult | None = None  # the latest held-out evaluation, question by question

    def _main_process_swarm(self, swarm: SwarmTransport | None) -> tuple[bool, str | None]:
        """(whether the node has a swarm, its peer id), as the main process sees it, on every process."""
        processes = self.accelerator.num_processes
        if processes == 1:
            return swarm is not None, swarm.peer_id if swarm is not None else None
        if swarm is not None and not self.accelerator.is_main_process:
            raise ValueError(
                "with several processes, pass the swarm on the main process only (swarm=None elsewhere): the node "
                "is one peer, and the main process fetches and publishes for all of them."
            )
        for name in ("num_local", "num_external"):
            if getattr(self.args, name) % processes != 0:
                raise ValueError(
                    f"{name}={getattr(self.args, name)} must be divisible by the number of processes ({processes}), "
                    "so that every process holds whole groups."
                )
        shared = [(swarm is not None, swarm.peer_id if swarm is not None else None)]
        return broadcast_object_list(shared, from_process=0)[0]

    def _check_external_support(self, train_dataset: Any) -> None:
        if self.tools or self.rollout_func is not None or self.environment_factories is not None:
            raise ValueError("num_external > 0 does not support tools, rollout_func or environment_factory yet.")
        if self.use_vllm and self.vllm_importance_sampling_correction:
            raise ValueError(
                "num_external > 0 with vLLM needs vllm_importance_sampling_correction=False: external completions "
                "have no sampling log-probabilities."
            )
        first = next(iter(train_dataset)) if train_dataset is not None else None
        if first is not None and not is_conversational(first):
            raise ValueError(
                "num_external > 0 needs a conversational dataset (a 'prompt' column of chat messages), since swarm "
                "groups carry their question as chat messages."
            )

    def _register_local_copy(self, train_dataset: Any) -> None:
        """Tell the verifier what this peer's own questions are: a non-procedural dataset to check received
        questions against, or the reasoning-gym configs it may regenerate in this process (cheap, our own)."""
        if not isinstance(train_dataset, Dataset) or len(train_dataset) == 0:
            return
        provenance = _row_provenance(train_dataset[0])
        if provenance.source == "dataset":
            self.verifier.register(provenance.dataset, train_dataset)
        elif provenance.source == "reasoning_gym":
            self.verifier.register_tasks(reasoning_gym_tasks_of(train_dataset))

    # ------------------------------------------------------------------------------------------------
    # the SAPO round

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        if not self.model.training:
            return super()._generate_and_score_completions(inputs)

        num_groups = len(inputs) // self.num_generations
        num_slots = min(self.args.num_external // self.accelerator.num_processes, num_groups)
        self._phase_seconds.clear()
        candidates, fetched_at = self._fetch_candidates(num_slots)
        external = self._select(candidates, num_slots, fetched_at)
        self._round = self._place_external_groups(inputs, external, first_slot=num_groups - num_slots)
        try:
            output = super()._generate_and_score_completions(self._round.rows)
            if self.plausibility is not None:  # TRL splits and shuffles it with the batch, row for row
                output[LOCAL_ROWS_KEY] = torch.tensor(
                    [i not in self._round.external_text for i in range(len(self._round.rows))], dtype=torch.bool
                )
            self._log_completions(
                "train",
                [
                    (str(self._round.rows[i].get("task", "")), _completion_text(completion))
                    for i, completion in sorted(self._round.local_completions.items())
                ],
            )
            self._publish_local_groups(self._round)
            self._log_round(num_slots, external)
        finally:
            self._round = None
        self._announce_phase("training")  # the rest of the step is TRL's loss, backward pass and optimizer step
        return output

    def _fetch_candidates(self, num_slots: int) -> tuple[list[Candidate], float]:
        """Groups of other peers, each verified and scored here (the drops counted), and when they were fetched."""
        if num_slots == 0 or not self._uses_swarm or not self._plausibility_ready():
            return [], time.time()
        pool_size = self.args.external_pool_size or 4 * self.args.num_external
        with self._timed("swarm_fetch"):
            received, fetched_at = self._fetch(pool_size)
        fresh = [item for item in received if not self.sampler.is_stale(item.group, fetched_at)]
        self.swarm_totals["dropped/stale"] += len(received) - len(fresh)  # before scoring: stale groups cost nothing
        with self._timed("external_scoring"):
            candidates = [self._judge(item.sender, item.group, fetched_at) for item in fresh]
        self.swarm_totals["candidates"] += len(received)
        return [c for c in candidates if c is not None], fetched_at

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

    def _select(self, candidates: list[Candidate], num_slots: int, fetched_at: float) -> list[Candidate]:
        """The sampler's choice for the whole node, counted; returns this process's share of it."""
        processes, rank = self.accelerator.num_processes, self.accelerator.process_index
        if num_slots == 0 or not self._uses_swarm:
            self.swarm_totals["fill_ins"] += num_slots * processes
            self.last_external = []
            return []
        selection = self.sampler.select(candidates, num_slots * processes, self._rng, now=fetched_at)
        chosen = self._drop_implausible(list(selection.chosen))  # slots it empties are filled in locally
        # Node-wide counts: every process sees the whole selection, so they agree.
        self.swarm_totals["external_groups"] += len(chosen)
        self.swarm_totals["fill_ins"] += num_slots * processes - len(chosen)
        self.taken_from.update(c.sender for c in chosen)
        for candidate in chosen:
            self.sender_outcomes.setdefault(candidate.sender, Counter())["taken"] += 1
        self.last_external = chosen
        self.swarm_totals.update({f"dropped/{reason}": n for reason, n in selection.dropped.items()})
        zero_advantage = sum(c.has_zero_advantage for c in candidates)
        self.swarm_totals["zero_advantage_candidates"] += zero_advantage
        if candidates:
            self._metrics["train"]["sapo/zero_advantage_fraction"].append(zero_advantage / len(candidates))
        return chosen[rank * num_slots : (rank + 1) * num_slots]

    def _fetch(self, pool_size: int) -> tuple[list[Any], float]:
        """Candidates from the swarm and the time they were fetched: the main process's, on every process."""
        if self.accelerator.num_processes == 1:
            return self.swarm.fetch(pool_size), time.time()
        fetched = [None]
        if self.accelerator.is_main_process:
            fetched = [(self.swarm.fetch(pool_size), time.time())]
        return broadcast_object_list(fetched, from_process=0)[0]

    def _judge(self, sender: str, group: Group, now: float) -> Candidate | None:
        """A candidate, or None: a benched sender's group is set aside unread; every other outcome counts towards
        its sender's standing."""
        if self.standing is None:
            return self._verify_and_score(sender, group)
        if self.standing.is_benched(sender, now):
            self._count_drop("benched_sender", sender, "its recent groups kept being dropped")
            return None
        candidate = self._verify_and_score(sender, group)
        self._record_standing(sender, candidate is not None, now)
        return candidate

    def _record_standing(self, sender: str, usable: bool, now: float) -> None:
        """Note one outcome of a sender's group in its standing (if standing is on); log when that benches it."""
        if self.standing is None or not self.standing.record(sender, usable, now):
            return
        self.swarm_totals["benched_senders"] += 1
        logger.warning(
            "benched peer %s for %.0f s: %d of its last %d groups were dropped",
            sender, self.standing.bench_seconds, self.standing.drop_limit, self.standing.window,
        )  # fmt: skip

    def _verify_and_score(self, sender: str, group: Group) -> Candidate | None:
        """A candidate with this peer's ground truth and rewards, or None (counted) if it cannot be used."""
        try:
            columns = self.verifier.columns_for(group)
        except GroupDropped as e:
            self._count_drop(e.reason, sender, e.detail)
            return None
        if len(group.completions) < self.num_generations:
            self._count_drop("group_size", sender, f"{len(group.completions)} < {self.num_generations} completions")
            return None
        completions = list(group.completions[: self.num_generations])
        problem = self.hygiene.group_problem(completions)
        if problem is not None:
            self._count_drop("hygiene", sender, problem)
            return None
        # Only completions cross the trust boundary: the prompt trained on (and scored) is written here, around the
        # question this node verified; the sender's prompt was only compared, never used.
        prompt = [*self._system_messages, {"role": "user", "content": columns.pop("question")}]
        group = Group(**{**vars(group), "completions": completions, "prompt": prompt})
        try:
            rewards = self._score_texts(group.prompt, completions, columns)
        except Exception as e:  # a reward function choking on foreign text must not stop training
            self._count_drop("reward_error", sender, f"{type(e).__name__}: {e}")
            return None
        return Candidate(sender=sender, group=group, rewards=rewards, columns=columns)

    def _drop_implausible(self, chosen: list[Candidate]) -> list[Candidate]:
        """The chosen groups whose every completion is plausible under this policy (`sapo.plausibility`); the others
        are counted as dropped (`implausible`). The main process judges (it holds the reference) and every process
        takes its verdicts."""
        if self.plausibility is None or not chosen:
            return chosen
        verdicts: list[Any] = [None]
        if self.accelerator.is_main_process:
            verdicts = [self._plausibility_verdicts(chosen)]
        if self.accelerator.num_processes > 1:
            verdicts = broadcast_object_list(verdicts, from_process=0)
        kept = []
        for candidate, verdict in zip(chosen, verdicts[0], strict=True):
            if verdict is None:
                kept.append(candidate)
            else:
                self._count_drop(verdict[0], candidate.sender, verdict[1])
                if verdict[0] == "implausible":  # its earlier "usable" outcome stays: one more outcome, a drop
                    self._record_standing(candidate.sender, False, time.time())
        return kept

    def _plausibility_verdicts(self, chosen: list[Candidate]) -> list[tuple[str, str] | None]:
        """Per group: None if plausible, else (drop reason, detail). One extra forward pass, without gradients."""
        with self._timed("plausibility"):
            prompt_ids, _, _ = self._tokenize_prompts([c.group.prompt for c in chosen])
            rows = [(list(p), self._completion_ids(text)[0]) for c, p in zip(chosen, prompt_ids, strict=True)
                    for text in c.group.completions]  # fmt: skip
            scores = self._typicality_scores_of(rows)
        size = self.num_generations
        verdicts = []
        for index in range(len(chosen)):
            problem = self.plausibility.group_problem(scores[index * size : (index + 1) * size])
            verdicts.append(None if problem is None else ("implausible", problem))
        return verdicts

    def _typicality_scores_of(self, rows: list[tuple[list[int], list[int]]]) -> list[CompletionStatistics]:
        """Plausibility statistics (`sapo.plausibility`) of (prompt ids, completion ids) rows under the current
        policy."""
        device = self.accelerator.device
        prompt_len, completion_len = max(len(p) for p, _ in rows), max(max(len(c) for _, c in rows), 1)
        pad = self._tokenizer.pad_token_id
        input_ids = torch.full((len(rows), prompt_len + completion_len), pad, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for i, (prompt, completion) in enumerate(rows):  # prompts padded on the left, completions on the right
            input_ids[i, prompt_len - len(prompt) : prompt_len] = torch.tensor(prompt, dtype=torch.long)
            input_ids[i, prompt_len : prompt_len + len(completion)] = torch.tensor(completion, dtype=torch.long)
            attention_mask[i, prompt_len - len(prompt) : prompt_len + len(completion)] = 1
        with torch.no_grad():
            logps, entropies, _ = self._get_per_token_logps_and_entropies(
                self.accelerator.unwrap_model(self.model),
                input_ids.to(device),
                attention_mask.to(device),
                completion_len,
                batch_size=self.args.per_device_train_batch_size,
                compute_entropy=True,
            )
        return self.plausibility.statistics(logps, entropies, attention_mask[:, prompt_len:].to(device))  # issue 23

    def _place_external_groups(
        self, inputs: list[dict[str, Any]], external: list[Candidate], first_slot: int
    ) -> _Round:
        """Rows for TRL: chosen external groups replace the questions of the last slots, the rest stay local."""
        rows = [dict(row) for row in inputs]
        round_ = _Round(rows=rows)
        keys = list(inputs[0].keys())
        for slot, candidate in enumerate(external, start=first_slot):
            for k, text in enumerate(candidate.group.completions):
                i = slot * self.num_generations + k
                rows[i] = {key: candidate.columns.get(key) for key in keys}
                rows[i]["prompt"] = candidate.group.prompt
                round_.external_text[i] = text
                round_.senders[i] = candidate.sender
        return round_

    # ------------------------------------------------------------------------------------------------
    # TRL hooks

    def _generate(self, prompts: list):
        """TRL's generation hook: generate the local rows (kept for publishing); re-tokenize the external rows."""
        round_ = self._round
        if round_ is None:  # TRL's own evaluation path
            return super()._generate(prompts)
        local = [i for i in range(len(prompts)) if i not in round_.external_text]
        if len(local) == len(prompts):
            with self._timed("generation"):
                result = super()._generate(prompts)
            round_.local_completions = dict(enumerate(result[3]))
            return result

        prompt_ids: list[list[int]] = [[] for _ in prompts]
        completion_ids: list[list[int]] = [[] for _ in prompts]
        completions: list[Any] = [None] * len(prompts)
        if local:
            with self._timed("generation"):
                l_prompt_ids, l_completion_ids, _, l_completions, *_ = super()._generate([prompts[i] for i in local])
            for j, i in enumerate(local):
                prompt_ids[i], completion_ids[i] = l_prompt_ids[j], l_completion_ids[j]
                completions[i] = round_.local_completions[i] = l_completions[j]

        external = sorted(round_.external_text)
        e_prompt_ids, _, _ = self._tokenize_prompts([prompts[i] for i in external])
        for j, i in enumerate(external):
            text = round_.external_text[i]
            prompt_ids[i] = list(e_prompt_ids[j])
            completion_ids[i] = self._tokenize_external_completion(text)
            completions[i] = [{"role": "assistant", "content": text}]
        return prompt_ids, completion_ids, None, completions, None, {}, None, []

    def _compute_loss(self, model, inputs):
        # The loss pass computes the log-probs of this node's own completions anyway: they are the plausibility
        # reference, at no extra cost (see _get_per_token_logps_and_entropies).
        self._loss_local_rows = inputs.get(LOCAL_ROWS_KEY) if self.plausibility is not None else None
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self._loss_local_rows = None

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        result = super()._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, *args, **kwargs
        )
        local = self._loss_local_rows
        if local is not None and local.any() and result[1] is not None:  # the loss pass computes entropies too
            completion_mask = attention_mask[:, -logits_to_keep:]
            # issue 23: per-token values in, the check's statistics (mean and worst span) out
            self.plausibility.add_own(
                self.plausibility.statistics(result[0][local], result[1][local], completion_mask[local])
            )
        return result

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        with self._timed("scoring"):
            rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if self._round is not None:
            start = self.accelerator.process_index * len(prompts)
            self._round.rewards = self._weighted(rewards_per_func[start : start + len(prompts)])
        return rewards_per_func

    def train(self, *args: Any, **kwargs: Any) -> Any:
        """TRL's training loop; at its end, the per-sender outcomes are written to `output_dir`/senders.json."""
        result = super().train(*args, **kwargs)
        self._write_sender_outcomes()
        return result

    def _write_sender_outcomes(self) -> None:
        if not self.accelerator.is_main_process or not self._uses_swarm:
            return
        os.makedirs(self.args.output_dir, exist_ok=True)
        path = os.path.join(self.args.output_dir, SENDERS_FILE)
        with open(path + ".tmp", "w") as f:
            json.dump({sender: dict(counts) for sender, counts in sorted(self.sender_outcomes.items())}, f, indent=1)
        os.replace(path + ".tmp", path)  # never a torn file, whenever the node is killed

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        super()._save_checkpoint(model, trial)
        self._write_sender_outcomes()
        pause = float(os.environ.get(FAULT_PAUSE_BEFORE_MARKER) or 0)
        if pause > 0:  # fault injection (tests): a kill in this window always leaves a half-written checkpoint
            time.sleep(pause)
        if self.args.should_save:  # the marker comes last: a checkpoint without it is incomplete
            folder = os.path.join(
                self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            )
            mark_complete(folder, self.state.global_step)

    # ------------------------------------------------------------------------------------------------
    # held-out evaluation

    def evaluate(
        self, eval_dataset: Any = None, ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval"
    ) -> dict[str, float]:
        """Greedy pass@1 on the held-out questions, logged as `eval/pass@1`, `eval/pass@1_se`, `eval/pass@1/<task>`.

        Replaces TRL's evaluation (sampled completions scored with the training rewards, plus a loss pass) with the
        measurement of `sapo.evaluation`; the Trainer's schedule drives it as usual (`eval_strategy`, `eval_steps`,
        `eval_on_start`), its figures go to every `report_to` logger, and it never fetches or publishes groups.
        """
        dataset = self.eval_dataset if eval_dataset is None else eval_dataset
        if dataset is None:  # evaluation is off (eval_on_start still calls here)
            logger.info("no held-out questions (eval_strategy='no' and no eval_dataset): evaluation skipped")
            return {}
        if isinstance(dataset, dict):
            metrics: dict[str, float] = {}
            for name, part in dataset.items():
                metrics.update(self.evaluate(part, ignore_keys, f"{metric_key_prefix}_{name}"))
            return metrics
        self._announce_phase("evaluating")
        self.last_evaluation = self._evaluate_held_out(dataset)
        self._log_completions("eval", [(q.task, q.completion) for q in self.last_evaluation.questions])
        metrics = self.last_evaluation.metrics(prefix=f"{metric_key_prefix}/")
        was_training = self.model.training
        self.model.eval()  # so that TRL's log() adds no training figures to this line
        try:
            self.log(metrics)
        finally:
            self.model.train(was_training)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def _evaluate_held_out(self, dataset: Any) -> HeldOutResult:
        """Each process evaluates a contiguous share of the questions; every process gets the whole result."""
        processes, rank = self.accelerator.num_processes, self.accelerator.process_index
        share = math.ceil(len(dataset) / processes)
        first = min(rank * share, len(dataset))
        result = evaluate_policy(
            self.accelerator.unwrap_model(self.model),
            self._tokenizer,
            dataset.select(range(first, min(first + share, len(dataset)))),
            max_new_tokens=self.max_completion_length,
            batch_size=self.args.per_device_eval_batch_size,
            eos_token_ids=self.eos_token_ids,
            first_index=first,
        )
        if processes > 1:
            result = HeldOutResult(gather_object(result.questions))
        return result

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if self.model.training:
            for name, value in sorted(self.swarm_totals.items()):
                logs[f"sapo/total/{name}"] = float(value)
            if self.swarm is not None:
                logs["sapo/peers"] = float(len(self.swarm.peers()))
                readout = self.swarm.readout()
                for name, value in sorted(readout.counters.items()):
                    logs[f"swarm/{name}"] = float(value)
                for name, value in sorted(readout.gauges.items()):
                    logs[f"swarm/gauge/{name}"] = float(value)
        super().log(logs, start_time)

    # ------------------------------------------------------------------------------------------------
    # helpers

    def _score_texts(self, prompt: list[dict[str, str]], texts: Sequence[str], columns: dict[str, Any]) -> list[float]:
        """This peer's weighted reward of each completion text, computed by TRL's own reward path (reward models,
        async rewards and weights behave as for local rows); NaN where no reward function applies."""
        rows = [{**columns, "prompt": prompt} for _ in texts]
        completions = [[{"role": "assistant", "content": t}] for t in texts]
        # Every process scores the same candidates: TRL's gather returns one copy per process, take the first.
        rewards_per_func = super()._calculate_rewards(rows, [prompt] * len(texts), completions, None)[: len(texts)]
        return self._weighted(rewards_per_func).tolist()

    def _weighted(self, rewards_per_func: torch.Tensor) -> torch.Tensor:
        """Weighted sum over reward functions per row, as TRL totals them: NaN (not applicable) terms are left out,
        and a row no function applies to stays NaN."""
        weights = self.reward_weights.to(rewards_per_func.device)
        weighted = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
        weighted[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
        return weighted.detach().cpu()

    def _tokenize_external_completion(self, text: str) -> list[int]:
        """Token ids of a foreign completion under this peer's tokenizer, ended with EOS when it fits (truncations
        counted)."""
        ids, truncated = self._completion_ids(text)
        if truncated:
            self.swarm_totals["external_truncated"] += 1
        return ids

    def _completion_ids(self, text: str) -> tuple[list[int], bool]:
        """Token ids of a foreign completion as it is trained on, and whether text was cut off to fit."""
        # split_special_tokens: a completion that spells out "<|im_end|>" must not become a control token.
        ids = self._tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        limit = self.args.max_completion_length
        if limit is not None and len(ids) >= limit:
            # At the limit exactly, the sender stopped there too (no EOS, like a local completion that ran out of
            # tokens); only a longer one loses text here.
            return list(ids[:limit]), len(ids) > limit
        return list(ids) + [self.eos_token_ids[0]], False

    def _log_completions(self, kind: str, completions: list[tuple[str, str]]) -> None:
        """Append ``(task, text)`` completions to `args.completions_log` (every process's, written by the main)."""
        if self.args.completions_log is None:
            return
        if self.accelerator.num_processes > 1 and kind == "train":  # evaluation results are gathered already
            completions = gather_object(completions)
        if not self.accelerator.is_main_process:
            return
        path = os.path.join(self.args.output_dir, self.args.completions_log)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        step = self.state.global_step
        with open(path, "a") as f:
            for task, text in completions:
                f.write(json.dumps({"step": step, "kind": kind, "task": task, "completion": text}) + "\n")

    def _publish_local_groups(self, round_: _Round) -> None:
        """Publish each group generated here this round as decoded text (every process calls it: it gathers)."""
        if not self._uses_swarm or not self.args.publish_groups:
            return
        local_rows = sorted(round_.local_completions)
        groups, now, step = [], time.time(), self.state.global_step
        for start in range(0, len(local_rows), self.num_generations):
            members = local_rows[start : start + self.num_generations]
            row = round_.rows[members[0]]
            texts = [_completion_text(round_.local_completions[i]) for i in members]
            groups.append(
                Group(
                    group_id=f"{step}-{self.accelerator.process_index}-{start // self.num_generations}",
                    prompt=published_prompt(row["prompt"]),
                    completions=texts,
                    provenance=_row_provenance(row),
                    metadata={"answer": str(row["answer"])} if row.get("answer") is not None else {},
                    model=self.swarm_model_name,
                    step=step,
                    created_at=now,
                )
            )
        if self.accelerator.num_processes > 1:
            groups = gather_object(groups)  # the main process publishes the groups of all processes
        if self.swarm is None or not groups:
            return
        try:
            with self._timed("publish"):
                self.swarm.publish(groups)
            self.swarm_totals["published_groups"] += len(groups)
        except RecordRejected as e:
            # Our own groups broke our own limits (e.g. a huge completion): skip them, keep training.
            self.swarm_totals[f"publish_rejected/{e.reason}"] += len(groups)
            logger.warning("not publishing %d groups of step %d: %s", len(groups), step, e)

    @contextlib.contextmanager
    def _timed(self, phase: str):
        """Add the seconds spent in ``phase`` to this round's `sapo/time/<phase>` metric (for benchmarks)."""
        self._announce_phase(phase)
        start = time.perf_counter()
        try:
            yield
        finally:
            self._phase_seconds[phase] += time.perf_counter() - start

    def _announce_phase(self, phase: str) -> None:
        """Tell callbacks that have an `on_phase(phase, state)` method what the step is doing now (a node's status)."""
        for callback in self.callback_handler.callbacks:
            on_phase = getattr(callback, "on_phase", None)
            if on_phase is not None:
                on_phase(phase, self.state)

    def _count_drop(self, reason: str, sender: str, detail: str) -> None:
        self.swarm_totals[f"dropped/{reason}"] += 1
        self.sender_outcomes.setdefault(sender, Counter())[f"dropped/{reason}"] += 1
        logger.debug("dropped a group of peer %s (%s): %s", sender, reason, detail)

    def _log_round(self, num_slots: int, external: list[Candidate]) -> None:
        """Per-round figures, averaged by TRL over each logging window."""
        metrics = self._metrics["train"]
        for phase, seconds in self._phase_seconds.items():
            metrics[f"sapo/time/{phase}"].append(seconds)
        metrics["sapo/external_groups"].append(float(len(external)))
        metrics["sapo/fill_ins"].append(float(num_slots - len(external)))
        metrics["sapo/distinct_senders"].append(float(len({c.sender for c in external})))
        if external:  # staleness of what is trained on: seconds since the sender made it, and its policy's lag
            now, step = time.time(), self.state.global_step
            metrics["sapo/external_age_seconds"].append(sum(now - c.group.created_at for c in external) / len(external))
            metrics["sapo/external_step_lag"].append(sum(step - c.group.step for c in external) / len(external))
        rewards = self._round.rewards
        if rewards is None:
            return
        is_external = torch.zeros(len(rewards), dtype=torch.bool)
        is_external[list(self._round.external_text)] = True
        # Local groups whose rewards differ: the ones the paper sampler would keep, to compare like with like
        # with the external groups (which it chose that way).
        groups = rewards.view(-1, self.num_generations)
        spread = (groups.nan_to_num(0.0).amax(dim=1) > groups.nan_to_num(0.0).amin(dim=1)).repeat_interleave(
            self.num_generations
        )
        for name, mask in (
            ("local_reward", ~is_external),
            ("external_reward", is_external),
            ("local_reward_with_spread", ~is_external & spread),
        ):
            values = rewards[mask]
            values = values[~torch.isnan(values)]
            if values.numel():
                metrics[f"sapo/{name}"].append(values.mean().item())


def _system_messages(train_dataset: Any) -> list[dict[str, str]]:
    """The system messages of this node's own prompts (its first row's), or none for a plain-text dataset."""
    if not isinstance(train_dataset, Dataset) or len(train_dataset) == 0:
        return []
    prompt = train_dataset[0].get("prompt")
    return [dict(m) for m in prompt if m.get("role") == "system"] if isinstance(prompt, list) else []


def _completion_text(completion: Any) -> str:
    """The text of a TRL completion: a string, or a list of chat messages whose contents are joined."""
    if isinstance(completion, str):
        return completion
    return "".join(str(message.get("content") or "") for message in completion)


def _row_provenance(row: dict[str, Any]) -> Provenance:
    """The provenance a dataset row carries in its 'provenance' column (JSON), or a 'custom' one."""
    raw = row.get("provenance")
    if raw:
        try:
            return provenance_from_wire(json.loads(raw) if isinstance(raw, str) else raw)
        except (ValueError, TypeError) as e:
            logger.warning("row has an unreadable provenance (%s); publishing it as a custom source", e)
    return Provenance(source="custom", dataset=str(row.get("task") or "unknown"))
