"""What a GRPO script relies on, run against both GRPOTrainer and SAPOTrainer (no swarm) with the same arguments and
the same expectations: swapping the class must keep the script working. Tiny random models, one or two steps each."""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset, DatasetDict
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from sapo import SAPOConfig, SAPOTrainer
from sapo.models import build_tiny_model
from sapo.speed.devices import SPEED_UP_FIELDS
from sapo.tasks import TaskSpec, build_held_out_dataset
from tests.trainer_fixtures import frozen_heap, tiny_model  # noqa: F401  (frozen_heap: a fixture)

pytestmark = pytest.mark.usefixtures("frozen_heap")

CONFIG_OF = {GRPOTrainer: GRPOConfig, SAPOTrainer: SAPOConfig}
TRAINERS = pytest.mark.parametrize("trainer_class", [GRPOTrainer, SAPOTrainer], ids=["grpo", "sapo"])
CONFIGS = pytest.mark.parametrize("config_class", [GRPOConfig, SAPOConfig], ids=["grpo", "sapo"])
TASK = TaskSpec("basic_arithmetic", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1})


def text_reward(prompts, completions, **columns):
    """Rewards that differ within a group (so advantages are not all zero), for plain and chat completions."""
    texts = [c if isinstance(c, str) else c[0]["content"] for c in completions]
    return [float(sum(map(ord, text)) % 7) for text in texts]


def _chat(n: int, offset: int = 0) -> Dataset:
    return Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"What is {i} + {i}?"}]} for i in range(offset, offset + n)]
    )


def _plain(n: int) -> Dataset:
    return Dataset.from_list([{"prompt": f"Count to {i}:"} for i in range(n)])


def _config(config_class, tmp_path, **overrides):
    base = dict(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, num_generations=2, max_completion_length=4,
        max_steps=1, learning_rate=1e-2, logging_steps=1, report_to="none", save_strategy="no", use_cpu=True,
        bf16=False, gradient_checkpointing=False, seed=0, disable_tqdm=True, per_device_eval_batch_size=2,
    )  # fmt: skip
    base.update(overrides)
    return config_class(**base)


def _trainer(
    trainer_class, tmp_path, tokenizer, train_dataset=None, trainer_kwargs=None, reward=text_reward, **overrides
):
    return trainer_class(
        model=tiny_model(tokenizer),
        reward_funcs=[reward],
        args=_config(CONFIG_OF[trainer_class], tmp_path, **overrides),
        train_dataset=train_dataset if train_dataset is not None else _chat(8),
        processing_class=tokenizer,
        **(trainer_kwargs or {}),
    )


def _logged(trainer, key):
    return [h[key] for h in trainer.state.log_history if key in h]


# ----------------------------------------------------------------------------------------------------
# batch geometry


GEOMETRY_GRID = [
    # per_device_train_batch_size, num_generations, gradient_accumulation_steps, other batch arguments
    (3, 3, 1, {}),
    (16, 2, 1, {}),
    (8, 8, 1, {}),
    (4, 2, 3, {}),
    (2, 4, 2, {}),
    (4, 4, 1, {"generation_batch_size": 16}),
    (2, 4, 1, {"steps_per_generation": 4}),
    (6, 3, 2, {"steps_per_generation": 1}),
]


@CONFIGS
@pytest.mark.parametrize("batch, generations, accumulation, other", GEOMETRY_GRID)
def test_the_same_arguments_give_the_same_batch_geometry(config_class, batch, generations, accumulation, other):
    arguments = dict(
        output_dir="/tmp/sapo-compat-geometry", per_device_train_batch_size=batch, num_generations=generations,
        gradient_accumulation_steps=accumulation, use_cpu=True, bf16=False, report_to="none", **other,
    )  # fmt: skip
    config = config_class(**arguments)
    steps = other.get("steps_per_generation") or other.get("generation_batch_size", batch * accumulation) // batch
    assert config.steps_per_generation == steps
    assert config.generation_batch_size == batch * steps
    assert config.gradient_accumulation_steps == accumulation
    if config_class is SAPOConfig:  # the round is the generation batch, split into I local and J external groups
        assert (config.num_local + config.num_external) * generations == config.generation_batch_size
        only_local = SAPOConfig(**arguments, num_external=0)
        assert only_local.num_local * generations == only_local.generation_batch_size == config.generation_batch_size
        assert only_local.gradient_accumulation_steps == accumulation


@CONFIGS
def test_both_refuse_a_generation_batch_of_partial_groups(config_class):
    with pytest.raises(ValueError, match="num_generations"):
        config_class(output_dir="/tmp/sapo-compat-geometry", per_device_train_batch_size=3, num_generations=2,
                     use_cpu=True, bf16=False, report_to="none")  # fmt: skip


def _counting_reward(scored: list[int]):
    """`text_reward` that appends to ``scored`` how many completions each call scores."""

    def counting_reward(prompts, completions, **columns):
        scored.append(len(completions))
        return text_reward(prompts, completions)

    return counting_reward


@TRAINERS
@pytest.mark.parametrize("batch, generations, accumulation", [(4, 2, 1), (2, 2, 2)])
def test_one_step_scores_one_generation_batch(trainer_class, tmp_path, smollm_tokenizer, batch, generations,
                                              accumulation):  # fmt: skip
    scored = []
    trainer = _trainer(
        trainer_class, tmp_path, smollm_tokenizer, reward=_counting_reward(scored), per_device_train_batch_size=batch,
        num_generations=generations, gradient_accumulation_steps=accumulation,
    )  # fmt: skip
    trainer.train()
    assert scored == [batch * accumulation]
    assert trainer.state.global_step == 1


# ----------------------------------------------------------------------------------------------------
# evaluation


def _eval_set(kind: str):
    if kind == "plain":
        return _plain(2)
    if kind == "chat":
        return _chat(2, offset=100)
    if kind == "reasoning_gym":
        return build_held_out_dataset([TASK], size=2)
    if kind == "dataset_dict":
        return DatasetDict({"first": _chat(2, offset=100), "second": _chat(2, offset=200)})
    if kind == "dict":
        return {"first": _chat(2, offset=100), "second": build_held_out_dataset([TASK], size=2)}
    if kind == "iterable":
        return _chat(2, offset=100).to_iterable_dataset()
    raise ValueError(kind)


LOSS_KEYS = {"dataset_dict": ["eval_first_loss", "eval_second_loss"], "dict": ["eval_first_loss", "eval_second_loss"]}


@TRAINERS
@pytest.mark.parametrize("kind", ["plain", "chat", "reasoning_gym", "dataset_dict", "dict", "iterable"])
def test_training_evaluates_every_kind_of_eval_set_with_its_loss(trainer_class, kind, tmp_path, smollm_tokenizer):
    train = _plain(8) if kind == "plain" else _chat(8)
    trainer = _trainer(trainer_class, tmp_path, smollm_tokenizer, train, eval_strategy="steps", eval_steps=1,
                       trainer_kwargs={"eval_dataset": _eval_set(kind)})  # fmt: skip
    trainer.train()
    for key in LOSS_KEYS.get(kind, ["eval_loss"]):
        (loss,) = _logged(trainer, key)  # evaluated once, after the step
        assert math.isfinite(loss)
    # evaluate() by hand: the same figures again, returned
    metrics = trainer.evaluate()
    assert all(math.isfinite(metrics[key]) for key in LOSS_KEYS.get(kind, ["eval_loss"]))


@TRAINERS
def test_evaluate_takes_an_eval_set_passed_to_it(trainer_class, tmp_path, smollm_tokenizer):
    trainer = _trainer(trainer_class, tmp_path, smollm_tokenizer)
    metrics = trainer.evaluate(_chat(2, offset=100), metric_key_prefix="held")
    assert math.isfinite(metrics["held_loss"])


@TRAINERS
def test_eval_on_start_evaluates_before_the_first_step(trainer_class, tmp_path, smollm_tokenizer):
    trainer = _trainer(trainer_class, tmp_path, smollm_tokenizer, trainer_kwargs={"eval_dataset": _chat(2, 100)},
                       eval_strategy="steps", eval_steps=10, eval_on_start=True)  # fmt: skip
    trainer.train()
    evaluated_at = [h["step"] for h in trainer.state.log_history if "eval_loss" in h]
    assert evaluated_at[0] == 0 and 1 not in evaluated_at[:-1]  # at the start (and after the last step)


@TRAINERS
def test_num_generations_eval_is_kept(trainer_class, tmp_path, smollm_tokenizer):
    scored = []
    trainer = _trainer(
        trainer_class, tmp_path, smollm_tokenizer, trainer_kwargs={"eval_dataset": _chat(1, offset=100)},
        reward=_counting_reward(scored), num_generations_eval=4, per_device_eval_batch_size=4, eval_strategy="steps",
        eval_steps=1,
    )  # fmt: skip
    assert trainer.args.num_generations_eval == 4
    trainer.evaluate()
    assert scored == [4]  # one eval question, 4 completions


# ----------------------------------------------------------------------------------------------------
# construction, losses, PEFT, checkpoints


@pytest.fixture(scope="module")
def eos_model(smollm_tokenizer, tmp_path_factory) -> str:
    """A tiny model on disk that ends every completion at once: TRL's defaults (8 completions of up to 256 tokens)
    then cost one token each. Every token embeds alike and the layers add nothing, so the last hidden state is the
    same everywhere; the (untied) output layer points EOS at it."""
    model = build_tiny_model(smollm_tokenizer, seed=0)
    model.config.tie_word_embeddings = False
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(torch.ones_like(model.model.embed_tokens.weight))
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.lm_head.weight = torch.nn.Parameter(torch.zeros_like(model.model.embed_tokens.weight))
        model.lm_head.weight[smollm_tokenizer.eos_token_id] = 10.0
    path = tmp_path_factory.mktemp("eos_model")
    model.save_pretrained(path)
    smollm_tokenizer.save_pretrained(path)
    return str(path)


@TRAINERS
def test_construction_without_args_trains(trainer_class, tmp_path, eos_model, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)  # the default output directory is relative
    if trainer_class is GRPOTrainer and not torch.cuda.is_available():
        # GRPOConfig() defaults to bf16 and refuses a machine without a GPU; SAPOConfig decides bf16 and use_cpu by
        # device, so the same call trains on a CPU (the SAPOTrainer case)
        with pytest.raises(ValueError, match="use_cpu"):
            trainer_class(model=eos_model, reward_funcs=text_reward, train_dataset=_chat(16))
        return
    with caplog.at_level(logging.INFO, logger="sapo"):
        trainer = trainer_class(model=eos_model, reward_funcs=text_reward, train_dataset=_chat(16))
    assert trainer.args.output_dir.endswith(("-GRPO", "-SAPO"))
    if trainer_class is SAPOTrainer:
        assert [r for r in caplog.records if "local GRPO learner" in r.getMessage()]
    trainer.args.max_steps = 1
    trainer.train()
    assert trainer.state.global_step == 1 and math.isfinite(_logged(trainer, "train_loss")[0])
    assert _logged(trainer, "completions/mean_length") == [1.0]


@TRAINERS
def test_grpo_trainer_s_arguments_are_taken_in_its_positions(trainer_class, tmp_path, smollm_tokenizer):
    """GRPOTrainer takes every argument by position (processing_class sixth, callbacks eighth, ...): a script that
    passes them so keeps working when the class is swapped."""

    class Marker(TrainerCallback):
        pass

    args = _config(CONFIG_OF[trainer_class], tmp_path)
    trainer = trainer_class(
        tiny_model(smollm_tokenizer), [text_reward], args, _chat(8), None, smollm_tokenizer, None, [Marker()]
    )
    assert trainer.processing_class is smollm_tokenizer and trainer.train_dataset is not None
    assert any(isinstance(callback, Marker) for callback in trainer.callback_handler.callbacks)


LOSS_TYPES = ["grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo"]


def test_the_loss_list_is_trl_s():
    help_text = next(f for f in GRPOConfig.__dataclass_fields__.values() if f.name == "loss_type").metadata["help"]
    assert all(f"'{name}'" in help_text for name in LOSS_TYPES)


@TRAINERS
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_every_loss_type_trains(trainer_class, loss_type, tmp_path, smollm_tokenizer):
    trainer = _trainer(trainer_class, tmp_path, smollm_tokenizer, loss_type=loss_type, per_device_train_batch_size=4)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    assert math.isfinite(_logged(trainer, "loss")[0])
    assert any(not torch.equal(b, a) for b, a in zip(before, trainer.model.parameters(), strict=True))


@TRAINERS
def test_peft_trains_the_adapter_only(trainer_class, tmp_path, smollm_tokenizer):
    from peft import LoraConfig

    lora = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = _trainer(trainer_class, tmp_path, smollm_tokenizer, trainer_kwargs={"peft_config": lora},
                       per_device_train_batch_size=4, num_generations=4)  # fmt: skip
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    changed = {n for n, p in trainer.model.named_parameters() if not torch.equal(before[n], p)}
    assert changed and all("lora_" in n for n in changed)


@TRAINERS
def test_training_resumes_from_a_checkpoint(trainer_class, tmp_path, smollm_tokenizer):
    first = _trainer(trainer_class, tmp_path, smollm_tokenizer, max_steps=2, save_strategy="steps", save_steps=1)
    first.train()
    checkpoint = tmp_path / "out" / "checkpoint-1"
    assert checkpoint.is_dir() and (tmp_path / "out" / "checkpoint-2").is_dir()
    again = _trainer(trainer_class, tmp_path, smollm_tokenizer, max_steps=2, save_strategy="no")
    again.train(resume_from_checkpoint=str(checkpoint))
    assert again.state.global_step == 2
    assert [h["step"] for h in again.state.log_history if "loss" in h] == [1, 2]  # step 1 from the checkpoint


def test_a_resumed_run_saves_at_the_interval_it_is_given_now(tmp_path, smollm_tokenizer):
    """A node restarted with another `--save_steps` saves at that interval, not at its checkpoint's (Trainer alone
    keeps the checkpoint's: step 3 would be saved here)."""
    prompts = _chat(64)
    first = _trainer(SAPOTrainer, tmp_path, smollm_tokenizer, prompts, max_steps=2, save_strategy="steps", save_steps=1)
    first.train()
    again = _trainer(SAPOTrainer, tmp_path, smollm_tokenizer, prompts, max_steps=4, save_strategy="steps", save_steps=5)
    again.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    assert again.state.global_step == 4 and again.state.save_steps == 5
    assert not (tmp_path / "out" / "checkpoint-3").exists() and (tmp_path / "out" / "checkpoint-4").is_dir()


def test_resuming_a_checkpoint_that_holds_every_step_trains_no_further(tmp_path, smollm_tokenizer):
    """A node killed after its last checkpoint (in its final evaluation, say) resumes from it: the run is complete,
    so nothing is trained past ``max_steps`` (GRPOTrainer, like Trainer, trains a step 3 here: it tests the limit
    only after a step)."""
    prompts = _chat(64)  # far more batches than steps, as in a node
    first = _trainer(SAPOTrainer, tmp_path, smollm_tokenizer, prompts, max_steps=2, save_strategy="steps", save_steps=1)
    first.train()
    trained = [p.detach().clone() for p in first.model.parameters()]
    again = _trainer(SAPOTrainer, tmp_path, smollm_tokenizer, prompts, max_steps=2, save_strategy="steps", save_steps=1)
    again.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    assert again.state.global_step == 2 and not (tmp_path / "out" / "checkpoint-3").exists()
    assert all(torch.equal(a, b) for a, b in zip(trained, again.model.parameters(), strict=True))


@TRAINERS
def test_a_trainer_built_without_its_init_takes_trl_s_rollout_path(trainer_class):
    """TRL's own tests build a trainer with `object.__new__` and set TRL's attributes only: SAPOTrainer's overrides
    then do what GRPOTrainer's methods do."""
    trainer = object.__new__(trainer_class)
    trainer.accelerator = SimpleNamespace(device=torch.device("cpu"))
    trainer.model = SimpleNamespace(training=True)
    trainer.use_vllm = False
    trainer.rollout_func = lambda prompts, trainer: {"prompt_ids": [[1]], "completion_ids": [[2]]}
    with pytest.raises(ValueError, match="rollout_func must return keys"):
        trainer._generate(["prompt"])


# ----------------------------------------------------------------------------------------------------
# what the speed-ups do not support: they step aside, and the trainer trains as GRPOTrainer does


def _step_asides(caplog, *words: str) -> list[str]:
    """The speed-ups' log lines that hold every one of ``words``."""
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("sapo.speed")]
    return [line for line in lines if all(word in line for word in words)]


BEAM_SEARCH = {"do_sample": True, "top_k": 50, "num_beams": 2, "length_penalty": -0.1}


@TRAINERS
def test_beam_search_generation_kwargs_train(trainer_class, tmp_path, smollm_tokenizer, caplog):
    trainer = _trainer(trainer_class, tmp_path, smollm_tokenizer, generation_kwargs=BEAM_SEARCH, max_steps=2,
                       per_device_train_batch_size=3, num_generations=3, max_completion_length=8)  # fmt: skip
    before = [p.detach().clone() for p in trainer.model.parameters()]
    with caplog.at_level(logging.INFO, logger="sapo.speed"):
        trainer.train()
    assert trainer.state.global_step == 2 and math.isfinite(_logged(trainer, "loss")[-1])
    assert any(not torch.equal(b, a) for b, a in zip(before, trainer.model.parameters(), strict=True))
    if trainer_class is SAPOTrainer:  # each speed-up that cannot decode beams said so once, not at every step
        assert len(_step_asides(caplog, "generation_prefill_once", "beam search")) == 1
        assert len(_step_asides(caplog, "generation_inverse_transform_sampling", "beam search")) == 1


@TRAINERS
@pytest.mark.parametrize("bf16", [False, True])
def test_lora_with_gradient_checkpointing_trains(trainer_class, bf16, tmp_path, smollm_tokenizer, caplog):
    """A float32 model, LoRA, gradient checkpointing (the GPU default): the recomputed layers match the forward pass,
    the adapters train and the base weights stay as they were."""
    from peft import LoraConfig

    trainer = _trainer(
        trainer_class, tmp_path, smollm_tokenizer, trainer_kwargs={"peft_config": LoraConfig()},
        gradient_checkpointing=True, bf16=bf16, learning_rate=0.1, max_steps=2, per_device_train_batch_size=3,
        num_generations=3, max_completion_length=8,
    )  # fmt: skip
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    with caplog.at_level(logging.INFO, logger="sapo.speed"):
        trainer.train()
    changed = {n for n, p in trainer.model.named_parameters() if not torch.equal(before[n], p)}
    assert changed and all("lora_" in n for n in changed)
    if trainer_class is SAPOTrainer:
        assert len(_step_asides(caplog, "cpu_fused_loss_pass", "gradient checkpointing")) == 1
        assert len(_step_asides(caplog, "bf16 weights", "gradient checkpointing")) == int(bf16)


UNKNOWN_KWARG = {"output_logits": False}
"""A `generate` argument none of the generation speed-ups knows."""

ALONE = {name: False for name in SPEED_UP_FIELDS}
GENERATION_SPEED_UPS = {
    # the speed-up -> the SAPOConfig fields that turn it on alone, and what shows it running while `generate` runs
    "generation_prefill_once": (
        {**ALONE, "generation_prefill_once": True},
        lambda model, spy: vars(model).get("generate") is not spy,
    ),
    "generation_inverse_transform_sampling": (
        {**ALONE, "generation_inverse_transform_sampling": True},
        lambda model, spy: torch.multinomial is not MULTINOMIAL,
    ),
    "generation_merge_adapters": (
        {**ALONE, "generation_merge_adapters": True},
        lambda model, spy: any(getattr(m, "merged_adapters", None) for m in model.modules()),
    ),
    "bf16 weights": (
        {**ALONE, "bf16": True},
        lambda model, spy: model.get_output_embeddings().weight.dtype == torch.bfloat16,
    ),
}
MULTINOMIAL = torch.multinomial


@pytest.mark.parametrize("speed_up", list(GENERATION_SPEED_UPS))
@pytest.mark.parametrize("unknown", [False, True], ids=["known", "unknown_kwarg"])
def test_each_generation_speed_up_leaves_an_unknown_generation_kwarg_to_trl(speed_up, unknown, tmp_path,
                                                                            smollm_tokenizer, caplog):  # fmt: skip
    """Each speed-up, alone, runs inside TRL's generation; given a generation kwarg it does not know, it steps aside
    (one log line) and TRL's generation runs as GRPOTrainer runs it."""
    from peft import LoraConfig

    fields, running = GENERATION_SPEED_UPS[speed_up]
    trainer = _trainer(
        SAPOTrainer, tmp_path, smollm_tokenizer, max_steps=2, **fields,
        generation_kwargs=UNKNOWN_KWARG if unknown else None,
        trainer_kwargs={"peft_config": LoraConfig(r=2, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")},
    )  # fmt: skip
    model, seen = trainer.model, []

    def spy(*args, **kwargs):  # the model's generate, noting whether the speed-up runs around it
        seen.append(running(model, spy))
        return type(model).generate(model, *args, **kwargs)

    model.generate = spy
    with caplog.at_level(logging.INFO, logger="sapo.speed"):
        trainer.train()
    del model.generate
    assert len(seen) == 2 and set(seen) == {not unknown}
    assert len(_step_asides(caplog, speed_up, "output_logits")) == int(unknown)


def test_the_benchmarks_timed_grpo_trainer_times_trl_s_own_round_and_evaluates(tmp_path, smollm_tokenizer):
    """benchmarks.turns' baseline (TRL's round through the bridge's default `sapo_round`) logs generation and scoring
    seconds at every step and nothing from an evaluation before the first step."""
    from benchmarks.turns import timed_grpo_trainer_class

    timed = timed_grpo_trainer_class()
    CONFIG_OF[timed] = GRPOConfig
    try:
        trainer = _trainer(timed, tmp_path, smollm_tokenizer, max_steps=2, eval_strategy="steps", eval_steps=2,
                           eval_on_start=True, trainer_kwargs={"eval_dataset": _chat(2, 100)})  # fmt: skip
        trainer.train()
    finally:
        del CONFIG_OF[timed]
    for phase in ("generation", "scoring"):
        seconds = _logged(trainer, f"sapo/time/{phase}")
        assert len(seconds) == 2 and all(s > 0 for s in seconds), (phase, seconds)
    assert len(_logged(trainer, "eval_loss")) == 2
