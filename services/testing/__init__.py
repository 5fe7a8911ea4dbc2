"""Test doubles that ship with hookbus, the way `faststream.redis.testing` ships its own.

The offline model is a deterministic stand-in for an OpenAI-compatible endpoint, served
over real HTTP on loopback so that the agent reaches it through the same `openai` client
code path as a real model. `make run`, the demo and the test suite use it when no
`OPENAI_BASE_URL` is set, and say so in one line; production prompts never depend on it.
"""
