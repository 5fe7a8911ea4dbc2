"""A streamed LLM call's chunks on their way to the client.

`chunk_pipeline` sends each chunk through `on_chunk` (batched when the stage is one remote
segment); `hold_back` keeps the window of text the streaming guardrails judge before it is
released; `assemble` builds the call's completion from its chunks for `after_llm_call`;
`turn_stream` shows the whole request to the client as one assistant turn.

Exposes `stream_chunks` and `Judged` (the pipeline the loop calls) and `TurnStream`.
"""

from hookbus.services.orchestrator.streaming.chunk_pipeline import Judged, stream_chunks
from hookbus.services.orchestrator.streaming.turn_stream import TurnStream

__all__ = ["Judged", "TurnStream", "stream_chunks"]
