"""In-process serving (``ignition.serving``): a tiny model prepared in the Heliopause
window is handed to Helios in the same process, served over HTTP at concurrency 4,
then closed; the Python replay harness then answers the same requests on the same
graphs, and the texts must be identical. A second handoff is refused.

With the prefix cache, prompts just before, at and after page boundaries are served
cold, then again as whole-prompt hits (restore and resume sampling) with another
seed and with penalties that depend on the rebuilt histogram: every hit's text must
be the harness's cold answer to the same prompt and seed. An extended prompt
restores the shorter one and prefills the rest; repeating it must reproduce it. Two
branches of one cached prompt served together (each restores the shared ancestor and
prefills its own tail) must answer as each does alone from its own checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ignition.serving import ServablePreparedModel, ServerConfig, ServingError, start_server

ROOT = Path(__file__).resolve().parent.parent

_SCENARIO = r"""
import json, sys, urllib.error, urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from checkpoints import write_tiny
from ignition.preparation.prepared import PrepareOptions
from ignition.replay.harness import Harness, Request
from ignition.replay.packing import SamplingParams
from ignition.serving import ServerConfig, ServingError, prepare_model, start_server

tmp = Path(sys.argv[1])
checkpoint = write_tiny(tmp / "ckpt", "llama", hidden=128, head_dim=32)
options = PrepareOptions(max_concurrency=4, prefill_chunk_size=256, context_limit=512,
                         kv_pages=64, snapshot_rows=2, compile=False)
servable = prepare_model(checkpoint, options)
prompts = [[5, 6, 7, 8, 9], list(range(10, 60)), [3] * 17, list(range(100, 300))]
sampling = dict(temperature=0.8, top_k=20, top_p=0.95, min_p=0.0)
handle = start_server(servable, ServerConfig(port=0, model="tiny"))

def complete(i):
    body = dict(model="tiny", prompt=prompts[i], max_tokens=12, seed=100 + i,
                presence_penalty=0.0, frequency_penalty=0.0, **sampling)
    request = urllib.request.Request(
        f"http://{handle.address}/v1/completions", json.dumps(body).encode(),
        {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        answer = json.load(response)
    return answer["choices"][0]["text"], answer["choices"][0]["finish_reason"]

with ThreadPoolExecutor(4) as pool:
    served = list(pool.map(complete, range(len(prompts))))
try:
    start_server(servable)
    second = None
except ServingError as error:
    second = str(error)
handle.close()
try:
    urllib.request.urlopen(f"http://{handle.address}/health", timeout=5)
    still_listening = True
except (urllib.error.URLError, OSError):
    still_listening = False

prepared = servable.prepared
prepared.reset()
requests = [Request(i, p, 12, SamplingParams(**sampling), 100 + i) for i, p in enumerate(prompts)]
results = Harness(prepared).run(requests)
def continuation(prompt, tokens):
    # The text the output adds to the prompt's (a word-level decoder joins words
    # with spaces, so the continuation starts with one), as Helios streams it.
    decode = lambda ids: prepared.tokenizer.decode(ids, skip_special_tokens=True)
    return decode(prompt + tokens)[len(decode(prompt)):]

python = [(continuation(p, r.tokens), r.finish_reason) for p, r in zip(prompts, results)]
print("RESULT " + json.dumps({"served": served, "python": python, "second": second,
                              "still_listening": still_listening}))
"""


_PREFIX_SCENARIO = r"""
import json, sys, urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from checkpoints import write_tiny
from ignition.preparation.prepared import PrepareOptions
from ignition.replay.harness import Harness, Request
from ignition.replay.packing import SamplingParams
from ignition.serving import ServerConfig, prepare_model, start_server

tmp = Path(sys.argv[1])
checkpoint = write_tiny(tmp / "ckpt", "qwen3", hidden=256, head_dim=64)
options = PrepareOptions(max_concurrency=4, prefill_chunk_size=256, context_limit=512,
                         kv_pages=96, snapshot_rows=32, compile=False)
servable = prepare_model(checkpoint, options)
page = servable.prepared.catalog.page_size
sampling = dict(temperature=0.9, top_k=30, top_p=0.95, min_p=0.0,
                repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.2)
handle = start_server(servable, ServerConfig(port=0, model="tiny"))

def complete(prompt, seed):
    body = dict(model="tiny", prompt=prompt, max_tokens=10, seed=seed, **sampling)
    request = urllib.request.Request(
        f"http://{handle.address}/v1/completions", json.dumps(body).encode(),
        {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        answer = json.load(response)
    cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
    return answer["choices"][0]["text"], cached

cases = []
for i, n in enumerate([page - 1, page, page + 1, 2 * page + 1]):
    prompt = [(7 * j + 13 * i) % 250 + 3 for j in range(n)]
    extended = prompt + [11, 12, 13, 14, 15]
    cases.append(dict(
        n=n, prompt=prompt, extended=extended,
        cold=complete(prompt, 10 + i),
        hit=complete(prompt, 20 + i),
        partial=complete(extended, 30 + i),
        again=complete(extended, 30 + i),
    ))
# Two branches of the longest cached prompt, served together: each restores the
# shared ancestor into its own slot and prefills its own tail over private pages.
# Served again alone, each is a whole-prompt hit of its own final-prompt checkpoint.
base = cases[-1]["prompt"]
branches = [base + [21, 22, 23], base + [31, 32, 33, 34, 35, 36, 37]]
with ThreadPoolExecutor(2) as pool:
    together = list(pool.map(lambda b: complete(b[1], 40 + b[0]), enumerate(branches)))
alone = [complete(branch, 40 + i) for i, branch in enumerate(branches)]
handle.close()

prepared = servable.prepared
prepared.reset()
params = SamplingParams(**sampling)
requests = []
for i, case in enumerate(cases):
    requests += [Request(2 * i, case["prompt"], 10, params, 10 + i),
                 Request(2 * i + 1, case["prompt"], 10, params, 20 + i)]
results = Harness(prepared).run(requests)
def continuation(prompt, tokens):
    decode = lambda ids: prepared.tokenizer.decode(ids, skip_special_tokens=True)
    return decode(prompt + tokens)[len(decode(prompt)):]
for i, case in enumerate(cases):
    case["python"] = [continuation(case["prompt"], results[2 * i + k].tokens) for k in (0, 1)]
print("RESULT " + json.dumps({"page": page, "cases": cases, "base": len(base),
                              "branches": [len(b) for b in branches],
                              "together": together, "alone": alone}))
"""


_SHUTDOWN_SCENARIO = r"""
import json, re, sys, threading, time, urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from checkpoints import write_tiny
from ignition.preparation.prepared import PrepareOptions
from ignition.replay.harness import Harness, Request
from ignition.replay.packing import SamplingParams
from ignition.serving import ServerConfig, prepare_model, start_server

tmp = Path(sys.argv[1])
checkpoint = write_tiny(tmp / "ckpt", "qwen3", hidden=256, head_dim=64)
options = PrepareOptions(max_concurrency=4, prefill_chunk_size=256, context_limit=512,
                         kv_pages=64, snapshot_rows=8, compile=False)
servable = prepare_model(checkpoint, options)
sampling = dict(temperature=0.8, top_k=20, top_p=0.95, min_p=0.0)
prompts = [[(5 * j + 11 * i) % 250 + 3 for j in range(90 + 37 * i)] for i in range(4)]
handle = start_server(servable, ServerConfig(port=0, model="tiny"))
base = f"http://{handle.address}"

def complete(i):
    body = dict(model="tiny", prompt=prompts[i], max_tokens=240, seed=300 + i, **sampling)
    request = urllib.request.Request(f"{base}/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        answer = json.load(response)
    return answer["choices"][0]["text"], answer["choices"][0]["finish_reason"]

def gauge(name):
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as response:
        text = response.read().decode()
    return float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))

pool = ThreadPoolExecutor(4)
futures = [pool.submit(complete, i) for i in range(4)]
# Close once all four run: their prompt checkpoints are being captured or published,
# and each finish captures a terminal checkpoint while the server drains.
deadline = time.monotonic() + 60
while gauge("flare_running_requests") < 4 and time.monotonic() < deadline:
    if any(f.done() for f in futures):  # one answer stopped early: close now
        break
    time.sleep(0.001)
running_at_close = gauge("flare_running_requests")
handle.close()
served = [f.result() for f in futures]

prepared = servable.prepared
prepared.reset()
requests = [Request(i, p, 240, SamplingParams(**sampling), 300 + i) for i, p in enumerate(prompts)]
results = Harness(prepared).run(requests)
def continuation(prompt, tokens):
    decode = lambda ids: prepared.tokenizer.decode(ids, skip_special_tokens=True)
    return decode(prompt + tokens)[len(decode(prompt)):]
python = [(continuation(p, r.tokens), r.finish_reason) for p, r in zip(prompts, results)]
print("RESULT " + json.dumps({"served": served, "python": python,
                              "running_at_close": running_at_close}))
"""


_MESSAGES_SCENARIO = r"""
import json, re, sys, urllib.request
from pathlib import Path
from checkpoints import write_tiny
from ignition.preparation.prepared import PrepareOptions
from ignition.replay.harness import Harness, Request
from ignition.replay.packing import SamplingParams
from ignition.serving import ServerConfig, prepare_model, start_server
from ignition.export.manifest import continuation_state

tmp = Path(sys.argv[1])
checkpoint = write_tiny(tmp / "ckpt", "qwen3", hidden=256, head_dim=64)
options = PrepareOptions(max_concurrency=4, prefill_chunk_size=256, context_limit=512,
                         kv_pages=96, snapshot_rows=32, compile=False)
servable = prepare_model(checkpoint, options)
continuation = continuation_state(servable.prepared)
sampling = dict(temperature=0.9, top_k=30, top_p=0.95, min_p=0.0)
handle = start_server(servable, ServerConfig(port=0, model="tiny"))
base = f"http://{handle.address}"

def words(seed, n):
    return " ".join(f"w{(seed * 31 + 7 * j) % 500}" for j in range(n))

def chat(messages, seed):
    body = dict(model="tiny", messages=messages, max_tokens=10, seed=seed, **sampling)
    request = urllib.request.Request(f"{base}/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        answer = json.load(response)
    usage = answer["usage"]
    return (answer["choices"][0]["message"]["content"], usage["prompt_tokens"],
            usage["prompt_tokens_details"]["cached_tokens"])

def counter(name):
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as response:
        text = response.read().decode()
    return float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))

# Five messages in fewer tokens than one prefill chunk: the core's state is K/V alone,
# so its message endpoints are captured after that one chunk, which does not sample;
# the resume graph samples instead.
conversation = [dict(role="system", content=words(1, 30)),
                dict(role="user", content=words(2, 25)),
                dict(role="assistant", content=words(3, 20)),
                dict(role="user", content=words(4, 35)),
                dict(role="assistant", content=words(5, 15)),
                dict(role="user", content=words(6, 20))]
first = chat(conversation, 10)
extension_only = counter("flare_prefix_extension_only_total")
# The same conversation with another seed resumes from the exact prompt checkpoint.
again = chat(conversation, 11)
# A branch after the fourth message restores an interior checkpoint and prefills the
# rest.
branch = chat(conversation[:4] + [dict(role="user", content=words(9, 12))], 12)
handle.close()

prepared = servable.prepared
prepared.reset()
tokenizer = prepared.tokenizer

def ids(messages, **kwargs):
    encoded = tokenizer.apply_chat_template(messages, tokenize=True, **kwargs)
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)

prompt = ids(conversation, add_generation_prompt=True)
# The fourth message's end: every message's rendering ends with a newline after
# <|im_end|>, and the next starts with <|im_start|>, so the cut is exact.
interior = len(ids(conversation[:4]))
params = SamplingParams(**sampling)
results = Harness(prepared).run([Request(0, prompt, 10, params, 10),
                                 Request(1, prompt, 10, params, 11)])
python = [tokenizer.decode(r.tokens, skip_special_tokens=True) for r in results]
print("RESULT " + json.dumps({
    "continuation": continuation, "prompt_tokens": len(prompt),
    "interior": interior, "first": first, "again": again, "branch": branch,
    "python": python, "extension_only": extension_only}))
"""


def _run_scenario(scenario: str, tmp_path: Path) -> dict:
    env = dict(os.environ)
    paths = [str(ROOT), str(ROOT / "tests"), env.get("PYTHONPATH")]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
    done = subprocess.run(
        [sys.executable, "-c", scenario, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-6000:]
    return json.loads(lines[-1].removeprefix("RESULT "))


@pytest.mark.gpu
def test_prefix_hits_reproduce_cold_answers_bitwise(tmp_path: Path) -> None:
    result = _run_scenario(_PREFIX_SCENARIO, tmp_path)
    for case in result["cases"]:
        n = case["n"]
        (cold, cold_cached), (hit, hit_cached) = case["cold"], case["hit"]
        assert cold_cached == 0, case
        # A whole-prompt hit restores every token and samples from the saved hidden
        # vector: the cold answer to the same prompt and seed, penalties included.
        assert hit_cached == n, case
        assert [cold, hit] == case["python"], case
        (partial, partial_cached), (again, again_cached) = case["partial"], case["again"]
        assert partial_cached == n and again_cached == n + 5, case
        assert again == partial and partial, case
    base, lengths = result["base"], result["branches"]
    # At least the shared ancestor is restored (a cached terminal prefix may by chance
    # also cover a tail's first token), never the whole branch.
    restored = [cached for _, cached in result["together"]]
    assert all(base <= c < n for c, n in zip(restored, lengths, strict=True)), result["together"]
    assert [cached for _, cached in result["alone"]] == lengths, result["alone"]
    together = [text for text, _ in result["together"]]
    assert together == [text for text, _ in result["alone"]] and all(together), result


@pytest.mark.gpu
def test_in_process_server_matches_the_python_harness(tmp_path: Path) -> None:
    result = _run_scenario(_SCENARIO, tmp_path)
    assert [tuple(x) for x in result["served"]] == [tuple(x) for x in result["python"]], result
    assert all(text for text, _ in result["served"]), result
    assert result["second"] is not None and "already" in result["second"], result
    assert result["still_listening"] is False, result


def test_a_consumed_model_is_refused_before_any_work() -> None:
    servable = ServablePreparedModel.__new__(ServablePreparedModel)
    servable.consumed = True
    with pytest.raises(ServingError, match="already handed"):
        start_server(servable, ServerConfig(port=0))


@pytest.mark.gpu
def test_shutdown_while_snapshots_are_in_flight_drains_and_leaves_state_clean(
    tmp_path: Path,
) -> None:
    result = _run_scenario(_SHUTDOWN_SCENARIO, tmp_path)
    # close() came while the requests ran (prompt checkpoints captured, terminal
    # captures still to come): it let them finish, then the Python harness, on the
    # same graphs and buffers after a reset, answers every request identically.
    assert result["running_at_close"] >= 2, result
    assert [tuple(x) for x in result["served"]] == [tuple(x) for x in result["python"]], result


@pytest.mark.gpu
def test_message_checkpoints_inside_a_chunk_answer_as_the_harness(tmp_path: Path) -> None:
    # Issue 23's message checkpoints without extra chunks, through Helios's scheduler
    # and executor on the GPU: a dense core declares its state positional K/V, so a
    # chat's message endpoints are snapshotted after the one chunk holding them
    # (admitted back to each endpoint, then forward), and the resume graph samples.
    from ignition.export import flare_core_pb2 as pb

    result = _run_scenario(_MESSAGES_SCENARIO, tmp_path)
    assert result["continuation"] == pb.CONTINUATION_STATE_POSITIONAL_KV, result
    n = result["prompt_tokens"]
    text, prompt_tokens, cached = result["first"]
    assert (prompt_tokens, cached) == (n, 0), result
    assert result["extension_only"] >= 3, result
    # Sampled by the resume graph from the chunk's hidden vector: the harness's answer,
    # which sampled at the end of its one chunk.
    # (The word-level decoder's spacing at the edges aside.)
    assert text.strip() == result["python"][0].strip() and text, result
    text, _, cached = result["again"]
    assert cached == n and text.strip() == result["python"][1].strip(), result
    # The branch restores the checkpoint at the fourth message's end (captured inside
    # the chunk), never more than the history it shares.
    _, branch_tokens, cached = result["branch"]
    assert cached == result["interior"] and cached < branch_tokens, result
