"""What runs a served engine, apart from HTTP: the engine on a thread (`loop.EngineLoop`) or in
its own process (`process.EngineProcess`, the server's default), the tensor-parallel ranks
(`tp.create_engine`), what the engine runs on this host (`engine_setup`), and the event loop a
process runs asyncio on (`aio`).

The server process imports this package but never torch: only `tp` imports it at module level,
and only the engine process (or the engine thread) imports `tp`.
"""
