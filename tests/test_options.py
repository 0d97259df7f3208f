"""Every option of SAPOConfig and NodeArguments is documented once (its help), and `help()`, `sapo-node --help` and
`--print-config` show that text; the node's swarm options are DHTTransportConfig's fields; the names of samplers and
source policies come from one list each; device defaults are decided in one place. In-process, no model."""

from __future__ import annotations

import dataclasses
import re
import typing

import pytest
import torch
from trl import GRPOConfig

import sapo.config
from sapo.config import SAPOConfig
from sapo.node.errors import NodeError
from sapo.node.help import FIRST_SCREEN, names_on_first_screen, option_sections
from sapo.node.options import _yaml_value, build_parser, config_yaml, full_help, parse_node_args, parse_node_options
from sapo.node.runner import NodeArguments
from sapo.sampling import SAMPLER_ALIASES, SAMPLERS, DropZeroAdvantageSampler, make_sampler
from sapo.sources import SOURCE_POLICIES
from sapo.speed.devices import DEVICE_FIELDS, cpu_has_native_bf16, device_defaults, round_micro_batch
from swarm.dht import DHTTransportConfig
from swarm.field_docs import field_help, parameter_docs

# NodeArguments field -> the DHTTransportConfig field it is.
SWARM_OPTIONS = {
    "initial_peers": "initial_peers",
    "host_maddrs": "host_maddrs",
    "announce_maddrs": "announce_maddrs",
    "identity": "identity_path",
    "swarm_name": "swarm_name",
    "client_mode": "client_mode",
    "use_auto_relay": "use_auto_relay",
    "join_timeout": "join_timeout",
    "rejoin_interval": "rejoin_interval",
    "rejoin_max_interval": "rejoin_max_interval",
}


# transformers 5 renamed gradient_checkpointing (activation_checkpointing); setting the old name warns.
pytestmark = pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning")


def _config(**overrides) -> SAPOConfig:
    return SAPOConfig(output_dir="/tmp/sapo-test-options", report_to="none", **overrides)


def _own_fields(cls: type) -> list[dataclasses.Field]:
    """The fields `cls` declares itself (SAPOConfig documents its own; GRPOConfig documents the rest)."""
    own = cls.__dict__.get("__annotations__", {})
    return [f for f in dataclasses.fields(cls) if f.name in own]


def _squash(text: str) -> str:
    # argparse and the docstring wrap lines differently (argparse also breaks after hyphens): compare without spaces.
    return re.sub(r"\s+", "", text)


@pytest.mark.parametrize("cls", [SAPOConfig, NodeArguments, DHTTransportConfig])
def test_every_field_has_one_documentation_which_the_docstring_shows(cls):
    fields = _own_fields(cls)
    assert fields
    missing = [f.name for f in fields if not field_help(f)]
    assert not missing, f'{cls.__name__} fields without metadata={{"help": ...}}: {missing}'
    assert parameter_docs(cls) == {f.name: field_help(f) for f in fields}


def test_help_all_and_print_config_show_each_fields_help():
    helps = {f.name: field_help(f) for cls in (SAPOConfig, NodeArguments) for f in _own_fields(cls)}
    shown_help = _squash(full_help())
    assert [name for name, text in helps.items() if _squash(text) not in shown_help] == []

    comments = {}
    for entry in config_yaml(parse_node_options([])).split("\n\n"):
        lines = entry.splitlines()
        key = next(line for line in lines if not line.startswith("#")).split(":", 1)[0]
        comments[key] = " ".join(line[2:] for line in lines if line.startswith("# "))
    shown = {name: text for name, text in helps.items() if name in comments}
    assert {"num_local", "sampling_strategy", "model", "initial_peers", "wait_for_peers"} <= set(shown)
    assert {name: _squash(comments[name]) for name in shown} == {name: _squash(text) for name, text in shown.items()}


@pytest.mark.parametrize("option, source", SWARM_OPTIONS.items())
def test_a_node_swarm_option_is_the_dht_swarm_config_field(option, source):
    node_field = {f.name: f for f in dataclasses.fields(NodeArguments)}[option]
    swarm_field = {f.name: f for f in dataclasses.fields(DHTTransportConfig)}[source]
    # Resolved types: HfArgumentParser replaces a field's string annotation with the type it names.
    assert typing.get_type_hints(NodeArguments)[option] == typing.get_type_hints(DHTTransportConfig)[source]
    assert getattr(NodeArguments(), option) == getattr(DHTTransportConfig(), source)
    swarm_help = field_help(swarm_field)
    assert swarm_help and field_help(node_field).startswith(" ".join(swarm_help.split()))
    if option == source:
        assert field_help(node_field) == field_help(swarm_field)


def test_node_arguments_stay_importable_from_every_module_that_offered_them():
    import sapo.node
    from sapo.node import arguments, options, runner

    # NodeArguments is defined in sapo.node.arguments; scripts import it from the parser's module, the runner or the
    # package, as before it moved.
    for name in ("NodeArguments", "default_task_names"):
        assert getattr(options, name) is getattr(runner, name) is getattr(sapo.node, name) is getattr(arguments, name)
    assert options.REWARD_NAMES is arguments.REWARD_NAMES
    assert type(parse_node_options([]).node) is arguments.NodeArguments


def test_sampler_and_source_policy_names_come_from_one_list_each():
    choices = {f.name: f.metadata["choices"] for f in dataclasses.fields(SAPOConfig) if "choices" in f.metadata}
    assert list(choices["sampling_strategy"]) == [*SAMPLERS, *SAMPLER_ALIASES]
    assert choices["external_source_policy"] == list(SOURCE_POLICIES)
    docs = parameter_docs(SAPOConfig)
    assert all(f'`"{name}"`' in docs["sampling_strategy"] for name in choices["sampling_strategy"])
    assert all(f'`"{name}"`' in docs["external_source_policy"] for name in SOURCE_POLICIES)
    assert SAPOConfig.__dataclass_fields__["sampling_strategy"].default in SAMPLERS


def test_the_parser_accepts_a_strategy_registered_after_sapo_config_was_imported(monkeypatch):
    """`sampling_strategy`'s choices are the live registry: what is registered after import is accepted, listed in
    the help and refused no more; what is not registered is refused in one line."""
    import sapo.sampling

    monkeypatch.setattr(sapo.sampling, "SAMPLERS", dict(SAMPLERS))

    class Late(DropZeroAdvantageSampler):
        pass

    sapo.sampling.register_sampler("late", Late)
    assert "late" in SAPOConfig.__dataclass_fields__["sampling_strategy"].metadata["choices"]
    assert parse_node_options(["--sampling_strategy", "late"]).args.sampling_strategy == "late"
    assert '`"late"` is `Late` (no docstring)' in _squash_spaces(full_help())


def _squash_spaces(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--sampling_strategy", "best"], "argument --sampling_strategy/--sampling-strategy: invalid choice: 'best'"),
        (["--replay", "sometimes"], "argument --replay: invalid choice: 'sometimes'"),
        (["--speedups", "fast"], "argument --speedups: invalid choice: 'fast'"),
        (["--num_local", "two"], "argument --num_local/--num-local: invalid int value: 'two'"),
    ],
)
def test_an_invalid_value_is_one_error_line(capsys, argv, message):
    """argparse prints its usage before its error, and the node's usage would list every option (hundreds of lines):
    the node refuses in one line, as every other start-up refusal, and says where the options are listed."""
    from sapo.node.cli import main

    assert main(argv) == 2
    [error] = capsys.readouterr().err.splitlines()
    assert (
        error.startswith("sapo-node: error: ")
        and message in error
        and error.endswith("sapo-node --help lists the options")
    )


def test_paper_is_an_alias_of_drop_zero_advantage():
    assert _config(sampling_strategy="paper").sampling_strategy == "drop_zero_advantage"
    assert _config().sampling_strategy == "drop_zero_advantage"
    assert isinstance(make_sampler("paper"), DropZeroAdvantageSampler)
    args, _, _ = parse_node_args(["--sampling_strategy", "paper"])
    assert args.sampling_strategy == "drop_zero_advantage"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the defaults of a machine without GPU")
def test_on_a_cpu_machine_a_script_and_the_node_get_the_same_cpu_defaults():
    native_bf16 = cpu_has_native_bf16()  # bf16 autocast only where the CPU computes it in hardware
    config = _config()
    assert config.gradient_checkpointing is False and config.use_cpu is True and config.bf16 is native_bf16
    assert config.scoring_prefill_once is True  # the loss pass runs each prompt once on a CPU
    args, _, _ = parse_node_args([])
    assert (args.gradient_checkpointing, args.use_cpu, args.bf16) == (False, True, native_bf16)
    assert args.scoring_prefill_once is True


def test_the_node_trains_a_round_in_one_micro_batch_of_whole_groups():
    """sapo-node's default micro-batch is a process's share of the round (the loss pass then runs each group's
    prompt once); a larger round is split into whole groups of at most 16 rows; an explicit size is kept."""
    args, _, _ = parse_node_args([])
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (8, 1)  # 2 groups of 4
    args, _, _ = parse_node_args(["--num_local", "4", "--num_external", "4", "--num_generations", "8"])
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (16, 4)
    args, _, _ = parse_node_args(["--num_local", "3", "--num_external", "3", "--num_generations", "6",
                                  "--per_device_eval_batch_size", "12"])  # fmt: skip
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (12, 3)  # 36 rows, 2 groups each
    args, _, _ = parse_node_args(["--per_device_train_batch_size", "4"])
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (4, 2)
    assert round_micro_batch(rows=14, processes=1, num_generations=7) == 14
    assert round_micro_batch(rows=8, processes=2, num_generations=4) == 4
    assert round_micro_batch(rows=34, processes=1, num_generations=17) == 2  # no whole group fits: a divisor
    # A script's SAPOConfig keeps TRL's default; None without a round sized by groups is refused, saying why.
    trl_default = GRPOConfig.__dataclass_fields__["per_device_train_batch_size"].default
    assert _config().per_device_train_batch_size == trl_default
    with pytest.raises(ValueError, match="per_device_train_batch_size=None .* num_local and num_external"):
        SAPOConfig(output_dir="/tmp/x", per_device_train_batch_size=None, num_generations=4)


def test_explicit_device_settings_are_kept(monkeypatch):
    config = _config(gradient_checkpointing=True)
    assert config.gradient_checkpointing is True and config.activation_checkpointing is True
    assert _config(activation_checkpointing=True).gradient_checkpointing is True
    args, _, _ = parse_node_args(["--gradient_checkpointing", "true"])
    assert args.gradient_checkpointing is True
    # On a GPU machine (simulated), the defaults turn around and an explicit False stays False. The simulated GPU
    # has no bf16: transformers checks bf16 against the real device, and this machine has no GPU.
    gpu = {**device_defaults(), "use_cpu": False, "gradient_checkpointing": True, "bf16": False,
           "scoring_prefill_once": False}  # fmt: skip
    monkeypatch.setattr(sapo.config, "device_defaults", lambda: gpu)
    assert _config().gradient_checkpointing is True and _config().use_cpu is False
    assert _config().scoring_prefill_once is False and _config(scoring_prefill_once=True).scoring_prefill_once
    assert _config(gradient_checkpointing=False, use_cpu=True).gradient_checkpointing is False
    args, _, _ = parse_node_args([])
    assert args.gradient_checkpointing is True and args.use_cpu is False


def test_parameter_docs_reads_a_trl_style_docstring():
    """parameter_docs reads a TRL-style docstring back (the check that docstring and help agree relies on it)."""

    @dataclasses.dataclass
    class Documented:
        """Intro.

        Parameters:
            > Heading

            first (`int`, defaults to `1`):
                One line,
                and another.
            second (`str`):
                Two.

        Returns nothing.
        """

        first: int = 1
        second: str = ""

    assert parameter_docs(Documented) == {"first": "One line, and another.", "second": "Two."}


def test_a_check_that_may_be_none_is_turned_off_with_none_on_the_command_line():
    args, _, _ = parse_node_args(["--plausibility_margin", "none", "--max_group_age", "null"])
    assert args.plausibility_margin is None and args.max_group_age is None
    args, _, _ = parse_node_args(["--plausibility_margin", "2.5"])
    assert args.plausibility_margin == 2.5


# ----------------------------------------------------------------------------------------------------
# the node's surface: --help, --help-all, --print-config, --version


def _printed(capsys, argv: list[str]) -> list[str]:
    from sapo.node.cli import main

    assert main(argv) == 0
    return capsys.readouterr().out.splitlines()


def test_help_shows_the_options_an_operator_sets_first_within_its_first_40_lines(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")  # a narrow terminal: the most lines
    printed = _printed(capsys, ["--help"])
    first_screen = "\n".join(printed[:40])
    expected = names_on_first_screen(build_parser())
    # What an operator sets first is there: model, peers, addresses, output, steps, questions and rewards.
    assert {"model", "initial_peers", "host_maddrs", "announce_maddrs", "output_dir", "max_steps", "dataset",
            "rewards"} <= set(expected) and expected == list(FIRST_SCREEN)  # fmt: skip
    for name in expected:
        assert re.search(rf"^  --{name} ", first_screen, flags=re.M), f"--{name} is not on the first 40 lines"
    assert "sapo-node --help-all" in first_screen
    for command in ("--print-config", "--version", "--config", "doctor", "health", "local-swarm", "eval", "report"):
        assert re.search(rf"^  {command} ", "\n".join(printed), flags=re.M), command


def test_help_names_every_heading_and_help_all_puts_each_option_under_one(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    short = " ".join(_printed(capsys, ["--help"]))
    every = _printed(capsys, ["--help-all"])
    sections = option_sections(build_parser())
    assert len(sections) > 20 and not [h for h, _ in sections if h == "Other settings"]  # each option's class knows it
    for heading, actions in sections:
        assert f"{heading}:" in every
        origin, title = heading.split(": ", 1)
        assert _squash(f"{title} ({len(actions)})") in _squash(short), heading
    options = [a.option_strings[0] for _, actions in sections for a in actions]
    parser_options = [a.option_strings[0] for a in build_parser()._actions if a.option_strings and a.dest != "help"]
    assert sorted(options) == sorted(parser_options)  # every option once
    listed = [line.split()[0] for line in every if line.startswith("  --")]
    assert sorted(listed) == sorted(parser_options)


def test_version_names_the_installed_distribution_and_the_wire_version(capsys):
    from importlib.metadata import version

    from swarm.records import WIRE_VERSION

    (line,) = _printed(capsys, ["--version"])
    assert line == f"sapo-node (sapo-swarm) {version('sapo-swarm')}, wire version {WIRE_VERSION}"


def _same_configuration(first, second) -> list[str]:
    """Names of the fields (of both the SAPOConfig and the NodeArguments) on which two parses differ."""
    differ = []
    for a, b in ((first.args, second.args), (first.node, second.node)):
        differ += [
            f.name for f in dataclasses.fields(a) if _yaml_value(getattr(a, f.name)) != _yaml_value(getattr(b, f.name))
        ]
    return differ


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--num_local", "2", "--num_external", "3", "--per_device_train_batch_size", "5", "--bf16", "false",
         "--lora_r", "0", "--lr_scheduler_type", "cosine", "--plausibility_margin", "none", "--learning_rate", "1e-5",
         "--set", "tasks=leg_counting,basic_arithmetic", "--initial_peers",
         "/ip4/203.0.113.7/tcp/31337/p2p/QmbHkbbrWMJXsY9Zm3stKpbmEgx5m5ZxSojoPSXZoGNypn", "--report_to", "tensorboard"],
        ["--generation_batch_size", "16", "--num_generations", "4", "--num_local", "3", "--use_cpu", "true",
         "--per_device_train_batch_size", "8",
         "--gradient_checkpointing", "true", "--logging_steps", "5", "--optim", "adafactor"],
    ],
)  # fmt: skip
def test_print_config_feeds_back_through_config_to_the_same_configuration(tmp_path, argv):
    first = parse_node_options(argv)
    printed = config_yaml(first)
    for name in DEVICE_FIELDS:  # the user's choice where given, else left to the machine that reads the file
        given = first.given[name]
        assert re.search(rf"^{name}: {'auto' if given is None else str(given).lower()}$", printed, flags=re.M), name
    path = tmp_path / "node.yaml"
    path.write_text(printed)
    again = parse_node_options(["--config", str(path)])
    assert _same_configuration(first, again) == []
    assert config_yaml(again) == printed  # byte for byte


def test_print_config_on_a_cpu_host_leaves_the_device_to_the_host_that_reads_it(tmp_path, monkeypatch):
    """A file printed on this CPU host, read on a GPU host (simulated), trains on the GPU with the GPU's defaults;
    what the user set (`--bf16 false`) stays set."""
    printed = config_yaml(parse_node_options(["--bf16", "false"]))
    assert re.search(r"^use_cpu: auto$", printed, flags=re.M) and re.search(r"^bf16: false$", printed, flags=re.M)
    assert parse_node_options(["--use_cpu", "auto"]).given["use_cpu"] is None  # `auto` flag: as if left out
    path = tmp_path / "node.yaml"
    path.write_text(printed)
    gpu = {**device_defaults(), "use_cpu": False, "gradient_checkpointing": True, "bf16": True,
           "scoring_prefill_once": False}  # fmt: skip
    monkeypatch.setattr(sapo.config, "device_defaults", lambda: gpu)
    on_gpu = parse_node_options(["--config", str(path)])
    assert (on_gpu.args.use_cpu, on_gpu.args.gradient_checkpointing, on_gpu.args.bf16) == (False, True, False)
    assert on_gpu.args.scoring_prefill_once is False  # the GPU's own speed-up defaults
    assert all(on_gpu.given[name] is None for name in DEVICE_FIELDS if name != "bf16")


def test_the_step_pace_rests_out_the_remainder_of_each_step_and_refuses_a_negative_one():
    from sapo.node.callbacks import StepPace

    now, rests, told = [100.0], [], []
    pace = StepPace(10.0, on_rest=told.append, clock=lambda: now[0],
                    sleep=lambda seconds: rests.append(seconds) or now.__setitem__(0, now[0] + seconds))  # fmt: skip
    for step_seconds in (3.0, 12.0, 0.5):  # a short step, a long one (no rest after it), a short one
        pace.on_step_begin(None, None, None)
        now[0] += step_seconds
    pace.on_step_begin(None, None, None)
    assert rests == [7.0, 9.5] == told  # the first step starts at once; each later one 10 s after the previous began
    assert parse_node_options(["--min_step_seconds", "2.5"]).node.min_step_seconds == 2.5
    with pytest.raises(NodeError, match="--min_step_seconds -1.0: give 0"):
        parse_node_options(["--min_step_seconds", "-1"])
