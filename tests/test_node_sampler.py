"""`sapo-node --sampler FILE.py:Class` (or `module:Class`): the node loads and registers a user's sampling strategy
before it reads its configuration, makes it the `sampling_strategy` (`--print-config` writes it and `--config` reads
it back), and a trainer given that configuration chooses external groups with it. A bad spec or a conflicting
`sampling_strategy` is one line. Tiny model, in-process swarm."""

from __future__ import annotations

import pytest

import sapo.sampling
from sapo.node.cli import main
from sapo.node.options import parse_node_options
from swarm import MemorySwarm
from tests.trainer_fixtures import G, RewardProbe, _external_group, _trainer

# No docstring on purpose: the help lists a strategy by its class name then.
SAMPLER_FILE = """
from sapo.sampling import UniformSampler


class InOrder(UniformSampler):
    config_fields = ("success_threshold",)
    offered = []

    def __init__(self, *args, success_threshold=1.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.success_threshold = success_threshold

    def order(self, eligible, rng):
        InOrder.offered.append(sorted(c.group.group_id for c in eligible))
        return sorted(eligible, key=lambda c: c.group.group_id)
"""


@pytest.fixture
def registry(monkeypatch):
    """The sampling strategies as they are; what a test registers is gone after it."""
    monkeypatch.setattr(sapo.sampling, "SAMPLERS", dict(sapo.sampling.SAMPLERS))


@pytest.fixture
def sampler_file(tmp_path):
    path = tmp_path / "in_order.py"
    path.write_text(SAMPLER_FILE)
    return f"{path}:InOrder"


def test_a_sampler_given_on_the_command_line_is_the_strategy_the_trainer_chooses_with(
    tmp_path, smollm_tokenizer, registry, sampler_file
):
    options = parse_node_options(["--sampler", sampler_file, "--success_threshold", "0.25"])
    assert options.args.sampling_strategy == "InOrder" and options.node.sampler == sampler_file
    assert options.args.success_threshold == 0.25
    in_order = sapo.sampling.SAMPLERS["InOrder"]

    swarm = MemorySwarm(seed=0)
    texts = {f"g{i}": [f"g{i} banana", f"g{i} apple", f"g{i} cherry", f"g{i} plum"] for i in (3, 1, 0, 2)}
    swarm.join("sender").publish([_external_group("What is 0 + 0?", t, gid, answer="0") for gid, t in texts.items()])
    probe = RewardProbe(lambda text: 1.0 if "banana" in text else 0.0)
    trainer = _trainer(
        tmp_path, smollm_tokenizer, "in_order", probe, swarm=swarm.join("rx"), external_source_policy="trust",
        max_steps=1, sampling_strategy=options.args.sampling_strategy, success_threshold=options.args.success_threshold,
    )  # fmt: skip
    assert type(trainer.intake.sampler) is in_order and trainer.intake.sampler.success_threshold == 0.25
    trainer.train()
    assert in_order.offered == [["g0", "g1", "g2", "g3"]]
    trained = {text.split()[0] for _, text in probe.trained if text.split()[0] in texts}
    assert trained == {"g0", "g1"}  # its order, not a uniform draw: the first two of four
    assert len([1 for _, text in probe.trained if text.split()[0] in texts]) == 2 * G


def test_print_config_writes_the_sampler_and_config_reads_it_back(tmp_path, capsys, registry, sampler_file):
    assert main(["--sampler", sampler_file, "--print-config"]) == 0
    printed = capsys.readouterr().out
    assert f"\nsampler: {sampler_file}\n" in printed and "\nsampling_strategy: InOrder\n" in printed
    assert '`"InOrder"` is `InOrder` (no docstring)' in " ".join(printed.replace("# ", "").split())
    config = tmp_path / "node.yaml"
    config.write_text(printed)
    assert main(["--config", str(config), "--print-config"]) == 0
    assert capsys.readouterr().out == printed


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--sampling_strategy", "uniform"], "is the strategy 'InOrder' but sampling_strategy is 'uniform'"),
        (["--sampler", "in_order_missing.py:InOrder"], "file in_order_missing.py not found"),
        (["--sampler", "sapo.sampling:Candidate"], "has no sapo.sampling.ExternalSampler subclass 'Candidate'"),
        (["--sampler", "sapo.sampling:ExternalSampler"], "leaves abstract methods unimplemented: ['order']"),
        (["--sampler", "InOrder"], "name a class as module:Class or path/to/file.py:Class"),
    ],
)
def test_a_bad_sampler_is_one_line(capsys, registry, sampler_file, extra, message):
    assert main(["--sampler", sampler_file, *extra, "--print-config"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("sapo-node: error: --sampler ") and message in err, err


def test_help_all_lists_the_sampler_given_and_refuses_a_bad_one_in_one_line(capsys, registry, sampler_file):
    assert main(["--sampler", sampler_file, "--help-all"]) == 0
    assert '`"InOrder"` is `InOrder` (no docstring)' in " ".join(capsys.readouterr().out.split())
    assert main(["--sampler", "nope", "--help-all"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and "name a class as module:Class" in captured.err
