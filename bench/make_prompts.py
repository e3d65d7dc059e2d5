"""Writes bench/prompts/agent50.jsonl: the 50-prompt corpus of the acceptance runs.

Chat questions, tool-use turns (tool definitions and tool results in the
conversation) and long contexts (a generated incident log of 1,500 to 6,000 tokens
followed by a question about one entry). Deterministic: rerunning writes the same file.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

CHAT = [
    "What is the capital of France?",
    "Explain photosynthesis in two sentences.",
    "Write a haiku about the sea.",
    "What are three tips for writing clean Python code?",
    "How many legs does a spider have?",
    "Give me a short recipe for pancakes.",
    "What is the difference between a list and a tuple in Python?",
    "Summarize the plot of Romeo and Juliet.",
    "Why is the sky blue?",
    "Translate 'good morning' into Spanish and German.",
    "What is 17 multiplied by 23?",
    "Name three planets in the solar system.",
    "What does a compiler do?",
    "Suggest a name for a friendly robot.",
    "How do vaccines work?",
    "What is the boiling point of water at sea level?",
    "Write a two-line poem about autumn leaves.",
    "What is machine learning?",
    "List four primary colors used in painting.",
    "How can I improve my sleep?",
    "What is the largest ocean on Earth?",
    "Describe a cat to someone who has never seen one.",
    "What causes earthquakes?",
    "Give an example of a prime number greater than 50.",
    "What is the purpose of a README file?",
    "Explain what an API is to a child.",
    "What is the tallest mountain in the world?",
    "Write a short thank-you note to a teacher.",
    "What is gravity?",
    "How does a bicycle stay upright?",
    "What are the benefits of drinking water?",
    "Who wrote 'Pride and Prejudice'?",
    "What is the speed of light?",
    "Give me three ideas for a weekend hobby.",
    "Explain recursion with a simple example.",
]

TOOLS = (
    "You can call these tools by answering with a JSON object "
    '{"name": ..., "arguments": {...}}:\n'
    "- get_weather(city: string): current weather\n"
    "- search_files(pattern: string): paths matching a glob\n"
    "- run_tests(path: string): run the test suite under path\n"
)

TOOL_TURNS = [
    ("What is the weather in Paris?", '{"city": "Paris", "temp_c": 18, "sky": "cloudy"}'),
    ("Find the Python files in src.", '["src/app.py", "src/util.py", "src/cli.py"]'),
    ("Run the tests in tests/unit.", '{"passed": 41, "failed": 2, "failures": ["test_io"]}'),
    ("Is it raining in Tokyo?", '{"city": "Tokyo", "temp_c": 22, "sky": "rain"}'),
    ("Which config files exist?", '["config.yaml", "config.local.yaml"]'),
]

SERVICES = ["auth", "billing", "search", "gateway", "storage", "mailer", "scheduler", "metrics"]
EVENTS = [
    "latency rose above the alert threshold",
    "a deploy finished and traffic shifted to the new version",
    "the error rate returned to normal",
    "a replica restarted after running out of memory",
    "disk usage crossed eighty percent",
    "a certificate was renewed ahead of expiry",
    "the cache hit ratio dropped sharply",
    "an operator rolled back the previous release",
]


def _log(rng: random.Random, entries: int) -> tuple[str, str, str]:
    lines = []
    for i in range(entries):
        service = rng.choice(SERVICES)
        event = rng.choice(EVENTS)
        lines.append(
            f"Entry {i + 1}: at 0{i % 10}:{(7 * i) % 60:02d} the {service} service: {event}."
        )
    target = rng.randrange(entries)
    answer_line = lines[target]
    question = f"Which service is named in entry {target + 1}, and what happened?"
    return "\n".join(lines), question, answer_line


def main() -> None:
    rng = random.Random(20261129)
    prompts: list[dict[str, object]] = []
    for text in CHAT:
        prompts.append({"kind": "chat", "messages": [{"role": "user", "content": text}]})
    for question, result in TOOL_TURNS:
        prompts.append(
            {
                "kind": "tool",
                "messages": [
                    {"role": "system", "content": TOOLS},
                    {"role": "user", "content": question},
                    {"role": "assistant", "content": '{"name": "tool", "arguments": {}}'},
                    {"role": "user", "content": f"Tool result: {result}\nAnswer briefly."},
                ],
            }
        )
    for entries in (60, 75, 90, 110, 130, 150, 170, 190, 215, 240):
        log, question, _ = _log(rng, entries)
        prompts.append(
            {
                "kind": "long",
                "messages": [
                    {"role": "user", "content": f"Here is an incident log.\n{log}\n\n{question}"}
                ],
            }
        )
    out = Path(__file__).parent / "prompts" / "agent50.jsonl"
    out.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    print(f"{len(prompts)} prompts -> {out}")


if __name__ == "__main__":
    main()
