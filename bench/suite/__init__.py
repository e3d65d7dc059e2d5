"""The benchmark suite (issue 5): Flare against its baselines and the bandwidth limit.

- ``workloads``: deterministic request generators (chat, long context at exact token
  counts, tool use, the agent trace with a fork) and the minimum measurement set.
- ``client``: one streaming client for any OpenAI-compatible server (TTFT, every
  inter-token gap, end-to-end latency, usage), run at a concurrency with warm-up,
  and the statistics the reports use.
- ``sdk_client``: the same chat requests through the official ``openai`` SDK, timed
  beside the suite's client (TTFT and the first SSE event to the first content).
- ``replay_floor``: the same requests through Ignition's Python replay harness.
- ``report``: the roofline, the ratio table and the plots.

``python -m bench.suite --help`` runs the measurement set against a server.
"""
