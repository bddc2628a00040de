"""HTTP server: SGLang-native `/generate` (server-sent events), OpenAI `/v1/completions`,
`/health`, `/server_info`, `/flush_cache`. Run with `python -m granikv.server --help`."""
