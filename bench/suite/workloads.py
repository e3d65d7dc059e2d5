"""Deterministic workloads: every request the suite sends, generated locally from a seed.

Text comes from a tokenizer-agnostic generator (an incident log of numbered entries).
Where a length matters (long-context prompts, the cached prefix and its tail, the tool
results of the agent trace) the text is fitted to an exact token count with the
tokenizer of the model under test, given as an ``encode`` callable: only the count of
what it returns is used, so any tokenizer (or a toy one in tests) works.

Every request carries the design's sampling (temperature 1, top-k 20, top-p 0.95) and
its own seed, derived from the suite seed and the request's name, so two engines given
the same suite seed receive the same requests with the same seeds.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from bench.make_prompts import EVENTS, SERVICES

Encode = Callable[[str], Sequence[int]]
Message = dict[str, Any]

CHAT = [
    "What is the capital of France?",
    "Explain photosynthesis in two sentences.",
    "Write a haiku about the sea.",
    "What are three tips for writing clean Python code?",
    "Give me a short recipe for pancakes.",
    "What is the difference between a list and a tuple in Python?",
    "Summarize the plot of Romeo and Juliet.",
    "Why is the sky blue?",
    "What does a compiler do?",
    "How do vaccines work?",
    "Explain recursion with a simple example.",
    "How does a bicycle stay upright?",
]

TOPICS = [
    "a lighthouse keeper who finds a message in a bottle",
    "the history of the printing press",
    "how a city's water supply works",
    "a robot learning to paint",
    "the migration of arctic terns",
    "building a compiler from scratch",
    "a journey across a desert by train",
    "the life cycle of a star",
]

DETAILS = [
    "see the runbook section on queues",
    "two pages were sent to the on-call engineer",
    "no customer impact was recorded",
    "the dashboard showed a brief spike",
    "a follow-up ticket was opened",
    "the retry budget absorbed the failures",
]

LONG_HEAD = "Here is an incident log.\n"
TAIL_HEAD = "\nQuestion: "

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {arg: {"type": "string", "description": help_text}},
                "required": [arg],
            },
        },
    }
    for name, description, arg, help_text in (
        ("get_weather", "Current weather in a city.", "city", "the city name"),
        ("search_files", "Paths matching a glob pattern.", "pattern", "a glob pattern"),
        ("run_tests", "Run the test suite under a path.", "path", "a directory"),
        ("read_file", "The contents of a file.", "path", "a file path"),
    )
]

# Who sends a request of the ``clients`` measurement (``BenchRequest.meta["client"]``):
# the suite's own streaming client (``bench.suite.client``) or the official ``openai``
# SDK (``bench.suite.sdk_client``). Requests without the key go through the suite's.
SUITE_CLIENT = "suite"
SDK_CLIENT = "openai-sdk"

CITIES = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Perth", "Quito", "Seoul"]
PATHS = ["src/app.py", "src/util.py", "src/cli.py", "tests/test_io.py", "config.yaml"]


@dataclass(frozen=True)
class Sampling:
    """The design's sampling and the request's seed (section 8 of the plan)."""

    temperature: float = 1.0
    top_k: int = 20
    top_p: float = 0.95
    seed: int = 0


@dataclass(frozen=True)
class BenchRequest:
    """One request: chat ``messages`` (``/v1/chat/completions``) or a ``prompt``, text or
    token ids (``/v1/completions``), with its output budget and sampling.

    ``name`` is unique within a workload; ``meta`` carries what the reports group by
    (target prompt tokens, agent turn and branch, repeat).
    """

    name: str
    workload: str
    max_tokens: int
    sampling: Sampling
    messages: list[Message] | None = None
    prompt: str | list[int] | None = None
    tools: list[dict[str, Any]] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.messages is None) == (self.prompt is None):
            raise ValueError(f"{self.name}: exactly one of messages and prompt")
        if self.max_tokens < 1:
            raise ValueError(f"{self.name}: max_tokens must be at least 1")

    @property
    def endpoint(self) -> str:
        """``chat`` or ``completions``."""
        return "chat" if self.messages is not None else "completions"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        return {key: value for key, value in data.items() if value is not None}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BenchRequest:
        fields = dict(data)
        fields["sampling"] = Sampling(**fields["sampling"])
        return cls(**fields)


def derive_seed(*parts: object) -> int:
    """A 31-bit seed from the suite seed and a request's name: stable across runs and
    Python versions (no ``hash()``)."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFF_FFFF


def filler_words(key: object, count: int) -> list[str]:
    """``count`` words of a generated incident log, fixed by ``key``; the words for a
    smaller count are a prefix of those for a larger one."""
    rng = random.Random(derive_seed("filler", key))
    words: list[str] = []
    entry = 0
    while len(words) < count:
        entry += 1
        sentence = (
            f"Entry {entry}: at {rng.randrange(24):02d}:{rng.randrange(60):02d} the "
            f"{rng.choice(SERVICES)} service reported that {rng.choice(EVENTS)}; "
            f"{rng.choice(DETAILS)} (ticket {rng.randrange(10_000, 100_000)})."
        )
        words.extend(sentence.split())
    return words[:count]


def question_words(key: object, count: int) -> list[str]:
    """``count`` words of questions about the log, fixed by ``key`` (prefix property as
    for ``filler_words``)."""
    rng = random.Random(derive_seed("question", key))
    words: list[str] = []
    while len(words) < count:
        entry = rng.randrange(1, 200)
        sentence = f"Which service is named in entry {entry}, and what happened next?"
        words.extend(sentence.split())
    return words[:count]


# Appended one at a time after the words when they fall short of the target: each adds
# at most one token with any sane tokenizer, and the shorter ones make progress with
# tokenizers that count characters.
_PADS = (" a", "a", " ", ".")
_MAX_PADS = 64


def fit_to_tokens(
    encode: Encode,
    target: int,
    words: Callable[[int], list[str]],
    *,
    head: str = "",
    tail: str = "",
) -> str:
    """``head + words + tail`` with exactly ``target`` tokens under ``encode``.

    Takes the longest prefix of the generated words that fits (binary search on the
    word count), then closes the remaining gap with short pads between the words and
    the tail. Raises ``ValueError`` when ``head + tail`` alone exceed the target or no
    pad lands exactly on it.
    """

    def count(text: str) -> int:
        return len(encode(text))

    if count(head + tail) > target:
        raise ValueError(f"head and tail alone exceed {target} tokens")
    n = max(16, target)
    pool = words(n)
    for _ in range(32):
        if count(head + " ".join(pool) + tail) >= target:
            break
        n *= 2
        pool = words(n)
    else:
        raise ValueError(f"the word generator cannot reach {target} tokens")

    def body(k: int) -> str:
        return " ".join(pool[:k])

    low, high = 0, len(pool)
    while low < high:
        mid = (low + high + 1) // 2
        if count(head + body(mid) + tail) <= target:
            low = mid
        else:
            high = mid - 1
    text = body(low)
    for _ in range(_MAX_PADS):
        have = count(head + text + tail)
        if have == target:
            return head + text + tail
        for pad in _PADS:
            if count(head + text + pad + tail) <= target:
                text += pad
                break
        else:
            break
    raise ValueError(f"cannot fit the text to exactly {target} tokens")


def long_prompt(encode: Encode, tokens: int, key: object) -> str:
    """A completion prompt of exactly ``tokens`` tokens: the incident log of ``key``."""
    return fit_to_tokens(encode, tokens, lambda n: filler_words(key, n), head=LONG_HEAD)


def long_requests(
    encode: Encode, tokens: int, count: int, seed: int, max_tokens: int, label: str = "long"
) -> list[BenchRequest]:
    """``count`` different prompts of ``tokens`` tokens each: every one is cold."""
    requests = []
    for i in range(count):
        name = f"{label}-{tokens}/{i}"
        requests.append(
            BenchRequest(
                name=name,
                workload=label,
                max_tokens=max_tokens,
                sampling=Sampling(seed=derive_seed(seed, name)),
                prompt=long_prompt(encode, tokens, (seed, name)),
                meta={"target_prompt_tokens": tokens, "repeat": i},
            )
        )
    return requests


def chat_requests(
    seed: int, count: int, max_tokens: int, *, long_answers: bool = False, label: str = "chat"
) -> list[BenchRequest]:
    """Single-turn chats; with ``long_answers`` they ask for an essay, so that most
    outputs run to ``max_tokens`` (no OpenAI-compatible field forbids EOS)."""
    rng = random.Random(derive_seed(seed, label))
    requests = []
    for i in range(count):
        if long_answers:
            text = (
                f"Write a long, detailed essay about {rng.choice(TOPICS)}. "
                "Use many paragraphs and do not stop early."
            )
        else:
            text = rng.choice(CHAT)
        name = f"{label}/{i}"
        requests.append(
            BenchRequest(
                name=name,
                workload=label,
                max_tokens=max_tokens,
                sampling=Sampling(seed=derive_seed(seed, name)),
                messages=[{"role": "user", "content": text}],
                meta={"repeat": i},
            )
        )
    return requests


def client_requests(
    seed: int, count: int, max_tokens: int
) -> tuple[list[BenchRequest], list[BenchRequest]]:
    """``(warmup, requests)`` of the ``clients`` measurement: ``count`` single-turn
    chats, each sent once unmeasured (so that both clients then find the server in the
    same state: a prefix cache holds the prompt) and then once by each client with the
    same seed, the order alternating per prompt so neither client is always first.
    The prompts are distinct up to ``len(CHAT)``, so no prompt is cached before its
    own first send."""
    questions = random.Random(derive_seed(seed, "clients")).sample(CHAT, len(CHAT))
    clients = (SUITE_CLIENT, SDK_CLIENT)
    warmup: list[BenchRequest] = []
    requests: list[BenchRequest] = []
    for i in range(count):
        prompt = f"clients/{i}"
        chat = BenchRequest(
            name=prompt,
            workload="clients",
            max_tokens=max_tokens,
            sampling=Sampling(seed=derive_seed(seed, prompt)),
            messages=[{"role": "user", "content": questions[i % len(questions)]}],
            meta={"prompt": prompt, "repeat": i},
        )
        warmup.append(_sent_by(chat, clients[i % 2], f"warmup-{prompt}"))
        order = clients if i % 2 == 0 else clients[::-1]
        requests += [_sent_by(chat, client, f"{prompt}/{client}") for client in order]
    return warmup, requests


def _sent_by(request: BenchRequest, client: str, name: str) -> BenchRequest:
    """``request`` under another name, sent by ``client`` (same prompt and seed)."""
    return replace(request, name=name, meta={**request.meta, "client": client})


def _tool_call(call_id: str, name: str, arguments: dict[str, str]) -> Message:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
        ],
    }


def _tool_result(call_id: str, content: str) -> Message:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def tool_requests(seed: int, count: int, max_tokens: int) -> list[BenchRequest]:
    """Tool-use conversations in OpenAI's shape: ``tools``, an assistant message with
    ``tool_calls``, the ``tool`` message with its result; the model answers next."""
    rng = random.Random(derive_seed(seed, "tools"))
    requests = []
    for i in range(count):
        call_id = f"call_{i}"
        kind = rng.randrange(3)
        if kind == 0:
            city = rng.choice(CITIES)
            question = f"What is the weather in {city}?"
            call = _tool_call(call_id, "get_weather", {"city": city})
            result = {"city": city, "temp_c": rng.randrange(-5, 35), "sky": "cloudy"}
        elif kind == 1:
            question = "Which Python files are in src?"
            call = _tool_call(call_id, "search_files", {"pattern": "src/*.py"})
            result = {"paths": rng.sample(PATHS, 3)}
        else:
            question = "Run the tests in tests/unit and tell me what failed."
            call = _tool_call(call_id, "run_tests", {"path": "tests/unit"})
            failed = rng.randrange(4)
            result = {"passed": rng.randrange(20, 60), "failed": failed}
        name = f"tools/{i}"
        requests.append(
            BenchRequest(
                name=name,
                workload="tools",
                max_tokens=max_tokens,
                sampling=Sampling(seed=derive_seed(seed, name)),
                messages=[
                    {"role": "system", "content": "You are a helpful assistant with tools."},
                    {"role": "user", "content": question},
                    call,
                    _tool_result(call_id, json.dumps(result)),
                ],
                tools=TOOLS,
                meta={"repeat": i},
            )
        )
    return requests


def _message_tokens(encode: Encode, message: Message) -> int:
    """Tokens of a message's text (content and tool-call arguments), without the chat
    template's framing, which the server adds and reports in ``usage``."""
    text = str(message.get("content") or "")
    for call in message.get("tool_calls") or []:
        text += call["function"]["name"] + call["function"]["arguments"]
    return len(encode(text)) if text else 0


def agent_trace(
    encode: Encode,
    *,
    seed: int,
    target_tokens: int = 32768,
    result_tokens: tuple[int, int] = (200, 400),
    max_tokens: int = 16,
    fork_turn: int | None = None,
    fork_turns: int = 2,
) -> list[BenchRequest]:
    """An agent's conversation, one request per turn: each turn appends a ``read_file``
    call and its result (``result_tokens`` tokens, drawn per turn) to the history, until
    the next turn would pass ``target_tokens`` of message text. Then ``fork_turns``
    requests of a branch that forks the main line at ``fork_turn`` (default: the middle
    turn) with different results: the fork shares the history before it. Then two
    repeats, each the very request (messages and seed) of the fork's first turn and of
    the main line's turn after the fork point: a server whose prefix cache restores
    exactly answers each as the first time (``repeat_of`` names the request).

    Requests are in the order they are to be sent (main line, then the fork); the
    histories are what the main line's own outputs would not change, so every engine
    sees the same prompts.
    """
    rng = random.Random(derive_seed(seed, "agent"))
    messages: list[Message] = [
        {
            "role": "system",
            "content": "You are a coding agent. Read files with the tools before answering.",
        },
        {"role": "user", "content": "Find why the nightly job fails and propose a fix."},
    ]
    used = sum(_message_tokens(encode, m) for m in messages)
    requests: list[BenchRequest] = []
    snapshots: list[tuple[int, int]] = []

    def ask(name: str, turn: int, branch: str, history: list[Message], tokens: int) -> None:
        meta: dict[str, Any] = {"turn": turn, "branch": branch, "history_tokens": tokens}
        if branch == "fork":
            meta["fork_of"] = fork_at
        requests.append(
            BenchRequest(
                name=name,
                workload="agent",
                max_tokens=max_tokens,
                sampling=Sampling(seed=derive_seed(seed, name)),
                messages=list(history),
                tools=TOOLS,
                meta=meta,
            )
        )

    def exchange(key: str, turn: int) -> tuple[list[Message], int]:
        call_id = f"call_{key}_{turn}"
        path = f"{rng.choice(PATHS)}#part{turn}"
        call = _tool_call(call_id, "read_file", {"path": path})
        size = rng.randint(*result_tokens)
        content = fit_to_tokens(
            encode, size, lambda n: filler_words((seed, key, turn), n), head=f"{path}:\n"
        )
        added = [call, _tool_result(call_id, content)]
        return added, sum(_message_tokens(encode, m) for m in added)

    fork_at = 0
    turn = 0
    while True:
        ask(f"agent/turn-{turn}", turn, "main", messages, used)
        snapshots.append((len(messages), used))
        added, tokens = exchange("main", turn)
        if used + tokens > target_tokens:
            break
        messages.extend(added)
        used += tokens
        turn += 1
    fork_at = len(snapshots) // 2 if fork_turn is None else fork_turn
    if not 0 <= fork_at < len(snapshots):
        raise ValueError(f"fork_turn {fork_at} outside the trace's {len(snapshots)} turns")
    length, used = snapshots[fork_at]
    branch = messages[:length]
    for j in range(fork_turns):
        added, tokens = exchange("fork", fork_at + j)
        branch.extend(added)
        used += tokens
        ask(f"agent/fork-{j}", fork_at + j + 1, "fork", branch, used)
    by_name = {r.name: r for r in requests}
    for first in ("agent/fork-0", f"agent/turn-{fork_at + 1}"):
        if first in by_name:
            original = by_name[first]
            meta = {**original.meta, "branch": "repeat", "repeat_of": first}
            requests.append(replace(original, name=f"agent/repeat-{first}", meta=meta))
    return requests


@dataclass(frozen=True)
class SuiteSettings:
    """The minimum measurement set's sizes (design table; PLAN.md section 8)."""

    seed: int = 0
    lengths: tuple[int, ...] = (512, 4096, 32768, 65536)
    long_repeats: int = 3
    long_max_tokens: int = 1
    concurrency: tuple[int, ...] = (1, 2, 4)
    decode_tokens: int = 256
    decode_rounds: int = 3
    prefix_tokens: int = 4096
    tail_tokens: int = 11
    prefix_repeats: int = 3
    prefix_max_tokens: int = 16
    agent_tokens: int = 32768
    agent_result_tokens: tuple[int, int] = (200, 400)
    agent_max_tokens: int = 16
    tool_conversations: int = 8
    tool_max_tokens: int = 64
    client_prompts: int = 12
    client_max_tokens: int = 16
    warmup: int = 2


WORKLOADS = ("long", "decode", "prefix", "agent", "tools", "clients")
# Workloads only an HTTP server answers (the in-process engines have no client).
HTTP_WORKLOADS = ("clients",)


@dataclass(frozen=True)
class Measurement:
    """One row group of the minimum set: requests sent at ``concurrency`` (in order
    when it is 1), after ``warmup`` requests whose samples are discarded.

    ``build`` returns ``(warmup, requests)``; it runs only if the measurement is not
    skipped, since fitting a 64K prompt costs tokenizer time. ``prompt_tokens`` is the
    largest prompt it sends and ``max_tokens`` its largest output budget, for the
    context check before building.
    """

    name: str
    kind: str
    concurrency: int
    prompt_tokens: int
    max_tokens: int
    build: Callable[[], tuple[list[BenchRequest], list[BenchRequest]]]


def prefix_requests(encode: Encode, settings: SuiteSettings) -> list[BenchRequest]:
    """Pairs to send in order: a ``prefix_tokens`` prompt (it fills the cache), then the
    same prompt plus a ``tail_tokens`` tail (the prefix hit)."""
    s = settings
    requests = []
    for i in range(s.prefix_repeats):
        key = (s.seed, "prefix", i)
        prefix = long_prompt(encode, s.prefix_tokens, key)
        full = fit_to_tokens(
            encode,
            s.prefix_tokens + s.tail_tokens,
            lambda n, key=key: question_words(key, n),
            head=prefix + TAIL_HEAD,
        )
        ids_prefix, ids_full = list(encode(prefix)), list(encode(full))
        shared = ids_full[: len(ids_prefix)] == ids_prefix
        for role, text, budget in (("prefix", prefix, 1), ("hit", full, s.prefix_max_tokens)):
            name = f"prefix-{s.prefix_tokens}+{s.tail_tokens}/{i}/{role}"
            requests.append(
                BenchRequest(
                    name=name,
                    workload="prefix",
                    max_tokens=budget,
                    sampling=Sampling(seed=derive_seed(s.seed, name)),
                    prompt=text,
                    meta={
                        "role": role,
                        "repeat": i,
                        "target_prompt_tokens": len(encode(text)),
                        "prefix_tokens_shared": shared,
                    },
                )
            )
    return requests


def minimum_set(
    encode: Encode, settings: SuiteSettings, workloads: Sequence[str] = WORKLOADS
) -> Iterator[Measurement]:
    """The measurements of the design's minimum set, in the order they run: long
    prompts shortest first (cold TTFT, prefill throughput, TTFT against length), decode
    at each concurrency, the prefix hit, the agent trace, tool use, and chat TTFT
    through the suite's client and the openai SDK side by side."""
    s = settings
    unknown = set(workloads) - set(WORKLOADS)
    if unknown:
        raise ValueError(f"unknown workloads {sorted(unknown)}; known: {', '.join(WORKLOADS)}")
    if "long" in workloads:
        for tokens in sorted(s.lengths):

            def build_long(tokens: int = tokens) -> tuple[list[BenchRequest], list[BenchRequest]]:
                warm = long_requests(encode, 128, s.warmup, s.seed, 1, label="warmup")
                return warm, long_requests(
                    encode, tokens, s.long_repeats, s.seed, s.long_max_tokens
                )

            yield Measurement(f"long-{tokens}", "long", 1, tokens, s.long_max_tokens, build_long)
    if "decode" in workloads:
        for c in s.concurrency:

            def build_decode(c: int = c) -> tuple[list[BenchRequest], list[BenchRequest]]:
                warm = chat_requests(s.seed, c, 16, long_answers=True, label=f"warmup-c{c}")
                runs = chat_requests(
                    s.seed,
                    c * s.decode_rounds,
                    s.decode_tokens,
                    long_answers=True,
                    label=f"decode-c{c}",
                )
                return warm, runs

            yield Measurement(f"decode-c{c}", "decode", c, 64, s.decode_tokens, build_decode)
    if "prefix" in workloads:
        total = s.prefix_tokens + s.tail_tokens
        yield Measurement(
            f"prefix-{s.prefix_tokens}+{s.tail_tokens}",
            "prefix",
            1,
            total,
            s.prefix_max_tokens,
            lambda: ([], prefix_requests(encode, s)),
        )
    if "agent" in workloads:

        def build_agent() -> tuple[list[BenchRequest], list[BenchRequest]]:
            trace = agent_trace(
                encode,
                seed=s.seed,
                target_tokens=s.agent_tokens,
                result_tokens=s.agent_result_tokens,
                max_tokens=s.agent_max_tokens,
            )
            return [], trace

        # The history's message text; the template adds a little, which the server's
        # usage reports per turn. Turns past the context limit fail one by one.
        yield Measurement(f"agent-{s.agent_tokens}", "agent", 1, 0, s.agent_max_tokens, build_agent)
    if "tools" in workloads:
        yield Measurement(
            "tools",
            "tools",
            1,
            0,
            s.tool_max_tokens,
            lambda: ([], tool_requests(s.seed, s.tool_conversations, s.tool_max_tokens)),
        )
    if "clients" in workloads:
        yield Measurement(
            "clients",
            "clients",
            1,
            0,
            s.client_max_tokens,
            lambda: client_requests(s.seed, s.client_prompts, s.client_max_tokens),
        )


def write_jsonl(requests: Sequence[BenchRequest], path: Path) -> None:
    """The requests, one JSON object a line (to inspect or replay them elsewhere)."""
    path.write_text("".join(json.dumps(r.to_json()) + "\n" for r in requests))


def read_jsonl(path: Path) -> list[BenchRequest]:
    return [
        BenchRequest.from_json(json.loads(line))
        for line in path.read_text().splitlines()
        if line.strip()
    ]
