"""The HTTP rollout engine: `RolloutEngine` + `LoadsWeights` over an external OpenAI-compatible
server (`tidal serve`, vLLM), so rollouts can run on a GPU cluster's inference server while the
trainer runs here. docs/design/serve.md, "The HTTP engine".

Generation is `POST {base_url}/completions` with token-id prompts (`prompt` a list of token-id
lists, `rollout.http.prompts_per_request` of them per request, each with its `n` samples), asking
for the sampled tokens as ids (`return_token_ids`, and `return_tokens_as_token_ids` for servers
that only put ids in the logprobs) and their logprobs (`logprobs: 0`). Up to `max_concurrency`
requests are in flight; a connection error, a timeout, 429 or 5xx is retried `retries` times with
exponential backoff, then raised as `EngineUnavailableError`; any other 4xx is
`EngineRequestError` at once. The server's answer is hostile input: every choice must be there
once, token ids must be ints inside the vocabulary, each token must have one finite logprob
<= 0, the finish reason must be stop or length, and an echoed `prompt_token_ids` must be the
prompt sent; anything else is `EngineResponseError`. The text is decoded here from the token
ids (and cut at the stop strings, as the embedded engine does), so the reward always scores the
very tokens the trainer trains on, whatever text the server sent.

Weights: `load_weights` sends a state (uploaded as safetensors bytes, or written to a folder both
sides see) to `POST {base_url}/weights` with its version and checksum; the server loads it,
hashes what it loaded and answers its version, or 409 on a checksum mismatch
(`WeightVerificationError`). `sequence_logprobs` asks the server for the prompt logprobs of a
sequence (`prompt_logprobs: 0`), which is how the trainer's canary check runs against the
server. `cancel` is looked at before each request and while waiting: once set, no new request
goes out and `PreemptedError` is raised (requests already sent finish on the server; their
results are dropped).

Shared by threads (the async loop's rollout worker generating, the trainer's thread publishing
for evaluation): a reload waits until the generations in flight from this engine are answered,
and none starts while it runs (`_Gate`), so no completion is sampled across a weight change; a
reload of the version and checksum the server already holds from this engine is skipped.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from torch import Tensor

from tidal.config.engine import HttpEngineConfig
from tidal.errors import (
    EngineRequestError,
    EngineResponseError,
    EngineUnavailableError,
    PreemptedError,
    WeightVerificationError,
)
from tidal.rollout.checksum import state_checksum
from tidal.rollout.engine import Cancel, SamplingParams, TokenCallback
from tidal.rollout.protocol import UNLOADED
from tidal.types import Completion, FinishReason

MAX_BACKOFF_FACTOR = 8  # the longest wait between retries, in units of `backoff_s`
POLL_S = 0.05  # how often a generate call waiting on its requests looks at `cancel`
LOGPROB_SLACK = 1e-4  # a logprob a little above 0 is rounding; far above is a broken server


class HttpEngine:
    """Samples on an OpenAI-compatible server (see the module docstring).

    `tokenizer` must be the served model's (prompts are rendered here, completions decoded here);
    `vocab_size` bounds the token ids accepted back (default: the tokenizer's length); `eos_ids`
    the ids that end a completion (default: the tokenizer's eos). `weights_dir`: where disk
    transfers write publications (required for `weight_transfer: disk`)."""

    def __init__(
        self,
        config: HttpEngineConfig,
        tokenizer: Any,
        *,
        vocab_size: int | None = None,
        eos_ids: list[int] | None = None,
        weights_dir: Path | None = None,
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.vocab_size = int(vocab_size) if vocab_size is not None else len(tokenizer)
        self.eos_ids = list(eos_ids) if eos_ids is not None else [int(tokenizer.eos_token_id)]
        self.weights_dir = Path(weights_dir) if weights_dir is not None else None
        if config.weight_transfer == "disk" and self.weights_dir is None:
            raise ValueError("rollout.http.weight_transfer=disk needs a weights folder (rollout.http.weights_dir)")
        self.api_key = os.environ.get(config.api_key_env) if config.api_key_env else None
        self.weight_version = UNLOADED  # until a publication is loaded (the server may report its own)
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._stats = {"requests": 0, "retries": 0, "failures": 0, "reloads": 0, "reloads_skipped": 0}
        self._gate = _Gate()
        self._loaded: tuple[int, str] | None = None  # (version, checksum) this engine last loaded

    # ---------------------------------------------------------------- RolloutEngine

    def generate(
        self,
        prompts: list[list[int]],
        n: int = 1,
        params: SamplingParams | None = None,
        on_token: TokenCallback | None = None,
        cancel: Cancel | None = None,
    ) -> list[list[Completion]]:
        """`n` completions per prompt, in prompt order. With `params.seed` set, the request of
        prompts [k * prompts_per_request, ...) carries seed + k, so one request gets exactly the
        seed (what an embedded engine given the same prompts would use). `on_token`, for the
        batcher's sake, is called with every token once its request is done (no streaming)."""
        params = params or SamplingParams()
        if n < 1:
            raise ValueError(f"n={n} must be >= 1")
        for index, prompt in enumerate(prompts):
            if not prompt:
                raise ValueError(f"prompt {index} is empty; a prompt needs at least one token")
        if not prompts:
            return []
        size = self.config.prompts_per_request
        chunks = [prompts[start : start + size] for start in range(0, len(prompts), size)]
        bodies = [self._generation_body(chunk, n, params, index) for index, chunk in enumerate(chunks)]
        out: list[list[Completion]] = []
        with self._gate.shared():  # no reload from this engine while its requests are out
            answers = self._run_all([lambda body=body: self._post("/completions", body, cancel) for body in bodies], cancel)
            for chunk, answer in zip(chunks, answers):
                out += self._completions(answer, chunk, n, params)
        if on_token is not None:
            for p, group in enumerate(out):
                for s, completion in enumerate(group):
                    for token in completion.token_ids:
                        on_token(p, s, token)
        return out

    def update_weights(self, state_dict: dict[str, Tensor] | None, version: int) -> None:
        """Send `state_dict` to the server as `version` (its checksum computed here). There is no
        model shared with a trainer here, so None is refused."""
        if state_dict is None:
            raise TypeError(
                "HttpEngine.update_weights(None, ...): the server holds its own copy of the weights, so there is "
                "nothing shared to bump; send the tensors (pipeline/weights.py publish_to_engine does)"
            )
        self.load_weights(state_dict, version, state_checksum(state_dict))

    # ---------------------------------------------------------------- LoadsWeights

    def load_weights(self, state: dict[str, Tensor], version: int, checksum: str) -> None:
        """POST /weights: the server loads `state`, verifies `checksum` and reports `version`;
        after the generations in flight are answered, and skipped when it is what this engine
        loaded last (the canary check that follows still asks the server)."""
        with self._gate.exclusive():
            if self._loaded == (version, checksum) and self.weight_version == version:
                self._count("reloads_skipped")
                return
            self._load(state, version, checksum)
            self._loaded = (version, checksum)
            self._count("reloads")

    def _load(self, state: dict[str, Tensor], version: int, checksum: str) -> None:
        self.weight_version = UNLOADED
        self._loaded = None
        config = self.config
        if config.weight_transfer == "disk":
            folder = self._write_folder(state, version)
            body: bytes = json.dumps({"version": version, "checksum": checksum, "path": str(folder)}).encode()
            answer = self._send("/weights", body, "application/json", config.reload_timeout_s, None, "weights")
        else:
            from safetensors.torch import save

            blob = save({name: tensor.detach().contiguous().cpu() for name, tensor in state.items()})
            path = f"/weights?version={version}&checksum={checksum}"
            answer = self._send(path, blob, "application/octet-stream", config.reload_timeout_s, None, "weights")
        if not isinstance(answer, dict) or answer.get("version") != version or answer.get("checksum") != checksum:
            raise EngineResponseError(
                f"the server's answer to the reload of weight version {version} does not confirm it "
                f"(got {str(answer)[:200]}); refusing to generate with weights it may not hold", self._url("/weights")
            )
        self.weight_version = version
        if config.weight_transfer == "disk":
            self._prune_folders(keep=version)

    def sequence_logprobs(self, ids: list[int]) -> list[float]:
        """The server's prompt logprobs of `ids` (vLLM's `prompt_logprobs`, which tidal serve implements)."""
        if len(ids) < 2:
            raise ValueError("sequence_logprobs needs at least two tokens (the first has no logprob)")
        body = {"model": self.config.model, "prompt": [list(ids)], "max_tokens": 1, "temperature": 1.0,
                "prompt_logprobs": 0, "n": 1}
        with self._gate.shared():  # not across a reload from another thread
            answer = self._post("/completions", body, None)
        choices = answer.get("choices") if isinstance(answer, dict) else None
        if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
            raise self._malformed("a prompt-logprobs answer needs exactly one choice")
        return self._prompt_logprobs(choices[0].get("prompt_logprobs"), ids)

    # ---------------------------------------------------------------- stats and shutdown

    def run_metrics(self) -> dict[str, float]:
        """Requests sent, retries made and requests failed so far (`http/...` in the run's metrics)."""
        with self._lock:
            return {f"http/{name}": count for name, count in self._stats.items()}

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    # ---------------------------------------------------------------- requests

    def _generation_body(self, chunk: list[list[int]], n: int, params: SamplingParams, index: int) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.config.model, "prompt": [list(p) for p in chunk], "n": n,
            "temperature": params.temperature, "top_p": params.top_p, "max_tokens": params.max_new_tokens,
            "logprobs": 0, "return_token_ids": True, "return_tokens_as_token_ids": True,
        }
        if params.stop:
            body["stop"] = list(params.stop)
        if params.seed is not None:
            body["seed"] = params.seed + index
        if params.ignore_eos:
            body["ignore_eos"] = True  # vLLM's; tidal serve refuses it (400)
        return body

    def _run_all(self, calls: list[Any], cancel: Cancel | None) -> list[Any]:
        """Run `calls` on the pool, at most `max_concurrency` at once; their results in order."""
        if len(calls) == 1:
            return [calls[0]()]
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.config.max_concurrency, thread_name_prefix="tidal-http-engine")
            pool = self._pool
        futures: list[Future] = [pool.submit(call) for call in calls]
        try:
            pending = set(futures)
            while pending:
                if cancel is not None and cancel.is_set():
                    raise PreemptedError(f"generation stopped with {len(pending)} of {len(futures)} requests unfinished")
                done, pending = wait(pending, timeout=POLL_S, return_when=FIRST_EXCEPTION)
                for future in done:
                    if future.exception() is not None:
                        raise future.exception()  # type: ignore[misc]
            return [future.result() for future in futures]
        finally:
            for future in futures:
                future.cancel()

    def _post(self, path: str, body: dict[str, Any], cancel: Cancel | None) -> Any:
        data = json.dumps(body).encode()
        return self._send(path, data, "application/json", self.config.timeout_s, cancel, "completions")

    def _url(self, path: str) -> str:
        return self.config.base_url + path

    def _send(self, path: str, data: bytes, content_type: str, timeout: float, cancel: Cancel | None, what: str) -> Any:
        """POST `data`, retrying what may pass (connection errors, timeouts, 429, 5xx); the JSON answer."""
        url, config = self._url(path), self.config
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        attempt = 0
        while True:
            if cancel is not None and cancel.is_set():
                raise PreemptedError(f"generation stopped before its request to {url}")
            with self._lock:
                self._stats["requests"] += 1
            problem, status, wait_s = "", None, None
            try:
                request = urllib.request.Request(url, data=data, headers=headers, method="POST")
                with urllib.request.urlopen(request, timeout=timeout) as response:
                    raw = response.read()
                return self._json(raw, url)
            except urllib.error.HTTPError as error:
                status, detail = error.code, _error_message(error)
                if status != 429 and status < 500:
                    self._count("failures")
                    if status == 409 and what == "weights":
                        raise WeightVerificationError(f"the server refused the weights: {detail}") from None
                    raise EngineRequestError(f"{url} answered {status}: {detail}", url, status) from None
                problem, wait_s = f"{status}: {detail}", _retry_after(error)
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as error:
                reason = getattr(error, "reason", error)
                problem = f"no answer ({reason})"
            if attempt >= config.retries:
                self._count("failures")
                raise EngineUnavailableError(
                    f"{url}: {problem} after {attempt + 1} attempt(s) (rollout.http.retries={config.retries}); "
                    "is the server up and reachable?", url, status,
                )
            attempt += 1
            self._count("retries")
            backoff = config.backoff_s * min(2 ** (attempt - 1), MAX_BACKOFF_FACTOR)
            _sleep(max(backoff, wait_s or 0.0), cancel)

    def _count(self, name: str) -> None:
        with self._lock:
            self._stats[name] += 1

    def _json(self, raw: bytes, url: str) -> Any:
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError) as error:
            raise EngineResponseError(f"{url} answered 200 with a body that is not JSON ({error}): {raw[:120]!r}", url, 200) from None

    def _malformed(self, message: str) -> EngineResponseError:
        return EngineResponseError(f"{self._url('/completions')}: malformed answer: {message}", self._url("/completions"), 200)

    # ---------------------------------------------------------------- parsing answers

    def _completions(self, answer: Any, chunk: list[list[int]], n: int, params: SamplingParams) -> list[list[Completion]]:
        """The chunk's completions from a /completions answer, every field checked."""
        if not isinstance(answer, dict) or not isinstance(answer.get("choices"), list):
            raise self._malformed(f"no 'choices' list in {str(answer)[:200]}")
        choices = answer["choices"]
        if len(choices) != len(chunk) * n:
            raise self._malformed(f"{len(choices)} choices for {len(chunk)} prompt(s) x n={n}")
        version = answer.get("weight_version", self.weight_version)  # tidal serve reports its own
        if type(version) is not int or version < UNLOADED:
            raise self._malformed(f"weight_version {version!r} is not a version number")
        slots: list[list[Completion | None]] = [[None] * n for _ in chunk]
        for choice in choices:
            if not isinstance(choice, dict):
                raise self._malformed(f"a choice is not an object: {str(choice)[:100]}")
            index = choice.get("index")
            if type(index) is not int or not 0 <= index < len(chunk) * n:
                raise self._malformed(f"choice index {index!r} outside [0, {len(chunk) * n})")
            prompt, sample = divmod(index, n)
            if slots[prompt][sample] is not None:
                raise self._malformed(f"choice index {index} appears twice")
            slots[prompt][sample] = self._completion(choice, chunk[prompt], params, version)
        return [[c for c in row if c is not None] for row in slots]

    def _completion(self, choice: dict[str, Any], prompt: list[int], params: SamplingParams, version: int) -> Completion:
        where = f"choice {choice.get('index')}"
        logprobs = choice.get("logprobs")
        if not isinstance(logprobs, dict):
            raise self._malformed(f"{where}: no logprobs object (the server must honour logprobs: 0)")
        token_ids = choice.get("token_ids")
        if token_ids is None:  # vLLM before return_token_ids: ids only inside the logprobs' tokens
            token_ids = [_token_id_text(token, where, self._malformed) for token in logprobs.get("tokens") or []]
        values = logprobs.get("token_logprobs")
        self._check_ids(token_ids, f"{where}: token_ids")
        if not isinstance(values, list) or len(values) != len(token_ids):
            count = len(values) if isinstance(values, list) else values
            raise self._malformed(f"{where}: {count} logprobs for {len(token_ids)} tokens")
        for value in values:
            if type(value) not in (int, float) or not math.isfinite(value) or value > LOGPROB_SLACK:
                raise self._malformed(f"{where}: logprob {value!r} is not a finite number <= 0")
        echoed = choice.get("prompt_token_ids")
        if echoed is not None and echoed != prompt:
            raise self._malformed(f"{where}: the server's prompt_token_ids are not the prompt sent (re-tokenised?)")
        finish = choice.get("finish_reason")
        if finish not in ("stop", "length"):
            raise self._malformed(f"{where}: finish_reason {finish!r} (expected 'stop' or 'length')")
        reason: FinishReason = "stop" if finish == "stop" else "length"
        text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
        if params.stop:
            cuts = [i for i in (text.find(s) for s in params.stop) if i >= 0]
            text = text[: min(cuts)] if cuts else text
        return Completion(prompt_ids=list(prompt), token_ids=list(token_ids), logprobs=[float(v) for v in values],
                          text=text, finish_reason=reason, weight_version=version)

    def _check_ids(self, ids: Any, where: str) -> None:
        if not isinstance(ids, list):
            raise self._malformed(f"{where} is not a list")
        for token in ids:
            if type(token) is not int or not 0 <= token < self.vocab_size:
                raise self._malformed(f"{where}: {token!r} is not a token id in [0, {self.vocab_size})")

    def _prompt_logprobs(self, entries: Any, ids: list[int]) -> list[float]:
        """Values of vLLM-shaped prompt logprobs: [null, {"<id>": {"logprob": x, ...}}, ...]."""
        if not isinstance(entries, list) or len(entries) != len(ids):
            raise self._malformed(f"prompt_logprobs must be a list of {len(ids)} entries, got {str(entries)[:120]}")
        out = []
        for position, (entry, token) in enumerate(zip(entries[1:], ids[1:]), start=1):
            item = entry.get(str(token)) if isinstance(entry, dict) else None
            value = item.get("logprob") if isinstance(item, dict) else item
            if type(value) not in (int, float) or not math.isfinite(value) or value > LOGPROB_SLACK:
                raise self._malformed(f"prompt_logprobs[{position}] has no finite logprob <= 0 for token {token}")
            out.append(float(value))
        return out

    # ---------------------------------------------------------------- disk transfer

    def _write_folder(self, state: dict[str, Tensor], version: int) -> Path:
        from safetensors.torch import save_file

        assert self.weights_dir is not None  # checked in __init__
        folder = self.weights_dir / f"v{version:08d}"
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / "model.safetensors.partial"
        save_file({name: tensor.detach().contiguous().cpu() for name, tensor in state.items()}, str(partial))
        partial.replace(folder / "model.safetensors")  # the server never sees half a file
        return folder

    def _prune_folders(self, keep: int) -> None:
        """Remove the folders of older publications once the server holds `keep`."""
        assert self.weights_dir is not None
        for folder in self.weights_dir.glob("v*"):
            if folder.is_dir() and folder.name != f"v{keep:08d}":
                shutil.rmtree(folder, ignore_errors=True)


class _Gate:
    """Readers-writer gate: many `shared` holders (generations) or one `exclusive` (a reload);
    a waiting reload lets no new generation in, so a busy rollout worker cannot starve it."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writing = False
        self._waiting_writers = 0

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._writing and not self._waiting_writers)
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._waiting_writers += 1
            self._cond.wait_for(lambda: not self._writing and not self._readers)
            self._waiting_writers -= 1
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()


def eos_ids_for(model: Any, tokenizer: Any) -> list[int]:
    """Every id that ends a completion of `model`: the tokenizer's eos plus its generation config's
    (the embedded engine's rule, for an engine that has the model's config but not its server)."""
    ids: list[int] = []
    generation = getattr(model, "generation_config", None)
    for candidate in (tokenizer.eos_token_id, getattr(generation, "eos_token_id", None)):
        for value in candidate if isinstance(candidate, (list, tuple)) else [candidate]:
            if value is not None and int(value) not in ids:
                ids.append(int(value))
    return ids


def _token_id_text(token: Any, where: str, malformed: Any) -> int:
    """vLLM's `return_tokens_as_token_ids` token text, 'token_id:123', as 123."""
    if isinstance(token, str) and token.startswith("token_id:") and token[9:].isdigit():
        return int(token[9:])
    raise malformed(f"{where}: no token_ids and logprobs token {str(token)[:40]!r} is not 'token_id:<id>'")


def _error_message(error: urllib.error.HTTPError) -> str:
    """The message of an OpenAI-shaped error body, else the start of the body."""
    try:
        raw = error.read()
    except OSError:
        return str(error.reason)
    try:
        body = json.loads(raw)
        message = body["error"]["message"] if isinstance(body.get("error"), dict) else body.get("detail", body)
        return str(message)[:500]
    except (ValueError, AttributeError, KeyError, TypeError):
        return raw[:300].decode("utf-8", errors="replace") or str(error.reason)


def _retry_after(error: urllib.error.HTTPError) -> float | None:
    value = error.headers.get("Retry-After") if error.headers else None
    try:
        return min(float(value), 60.0) if value is not None else None
    except ValueError:
        return None


def _sleep(seconds: float, cancel: Cancel | None) -> None:
    """Sleep, waking early (to raise at the next check) once `cancel` is set."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cancel is not None and cancel.is_set():
            return
        time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
