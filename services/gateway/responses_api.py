"""The OpenAI Responses API: `POST /v1/responses`, `GET /v1/responses/{id}`,
`DELETE /v1/responses/{id}`.

A response runs exactly as a Chat Completions request does: its input becomes chat
messages (hookbus.services.gateway.responses_translate) that go onto the queue through the
same checks and the same submit, so every lifecycle point fires as for Chat Completions,
`finalize_connection` included, on every path. The response id (`resp_...`) is the run's
completion id: hooks, logs and the monitor see it.

- Not streamed: the Response object, or the run's error as its HTTP status (OpenAI's
  error body).
- Streamed: the gateway waits for the run's first item before it sends headers, so an
  error raised before it (a 402 in `on_connection`) is a real HTTP error. Then
  `response.created`, `response.in_progress`, the output item, content part, text and
  function-call argument events, and `response.completed` (or `response.incomplete`);
  every event has a `sequence_number`. The agent's own tool rounds are not output items:
  while one of its tools runs, the stream carries SSE comment lines
  (`: hookbus: tool NAME running`), which clients skip. An error after the stream started is an `error`
  event (the hook's code and message) and then `response.failed`.
- A client that disconnects before its answer ended gets its run cancelled.
- `store` (default true) keeps the response and its conversation under the caller's
  principal (hookbus.bus.store.stored_responses) before the answer (or `response.completed`)
  goes out, so a `previous_response_id` sent right after finds it. A response of another
  principal, a deleted or an expired one is a 404.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import structlog
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from hookbus.bus.connection.retrying import RECONNECT_ERRORS
from hookbus.bus.store.stored_responses import MAX_STORED_BYTES, StoredResponse, StoredResponses
from hookbus.services.gateway.chat_completions import (
    COMPLETION_ID_HEADER,
    Relay,
    final_completion,
    open_stream,
    read_payload,
    relay_response,
    submit_chat,
)
from hookbus.services.gateway.errors import GatewayError
from hookbus.services.gateway.responses_models import (
    DeletedResponse,
    ResponseObject,
    ResponsesRequest,
)
from hookbus.services.gateway.responses_translate import (
    ResponseEvents,
    assistant_message,
    chat_request,
    from_completion,
    input_messages,
    new_response,
    new_response_id,
)
from hookbus.services.gateway.sse import sse_comment, sse_event
from hookbus.services.gateway.state import Gateway, gateway_of
from hookbus.skills import AuthInfo

log = structlog.get_logger("hookbus.gateway")

Keep = Callable[[ResponseObject], Coroutine[Any, Any, None]]


def wire(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(mode="json", by_alias=True)


async def create_response(request: Request) -> Response:
    gw = gateway_of(request)
    started = time.perf_counter()
    auth = gw.authenticate(request)
    payload = await read_payload(request, gw, ResponsesRequest)
    if payload is None:
        return Response(status_code=499)
    if payload.store is not False:
        await _within_quota(gw, request, auth)
    history = await _history(gw.responses, auth, payload.previous_response_id)
    new_input = input_messages(payload)
    chat = chat_request(payload, history, new_input)
    response_id = new_response_id()
    submitted = await submit_chat(request, gw, auth, chat, completion_id=response_id)
    response = new_response(payload, response_id)
    keep = _keeper(gw.responses, auth, history + new_input, enabled=payload.store is not False)
    if payload.stream:
        relay = await open_stream(request, gw, submitted, started)
        if relay is None:
            return Response(status_code=499)
        frames = _frames(gw, relay, ResponseEvents(response), keep)
        return relay_response(request, gw, response_id, relay, frames)
    completion = await final_completion(request, gw, submitted)
    if completion is None:
        return Response(status_code=499)
    finished = from_completion(response, completion)
    await keep(finished)
    return JSONResponse(wire(finished), headers={COMPLETION_ID_HEADER: response_id})


async def stored_response(request: Request) -> Response:
    """`/v1/responses/{id}`: GET or DELETE. One route for both methods, so that a request
    with any other method (OPTIONS) is answered 405 with `Allow` naming both."""
    if request.method == "DELETE":
        return await delete_response(request)
    return await retrieve_response(request)


async def retrieve_response(request: Request) -> Response:
    gw = gateway_of(request)
    response_id = request.path_params["response_id"]
    stored = await _stored(gw.responses, gw.authenticate(request), response_id)
    return JSONResponse(stored.response)


async def delete_response(request: Request) -> Response:
    gw = gateway_of(request)
    response_id = request.path_params["response_id"]
    auth = gw.authenticate(request)
    try:
        deleted = await gw.responses.delete(auth, response_id)
    except RECONNECT_ERRORS as exc:
        raise GatewayError(503, "bus_unavailable", f"the response store is unreachable: {exc}") from exc
    if not deleted:
        raise _not_found(response_id, "response_id")
    return JSONResponse(wire(DeletedResponse(id=response_id)))


# ------------------------------------------------------------------ internals


async def _stored(store: StoredResponses, auth: AuthInfo, response_id: str, param: str = "response_id") -> StoredResponse:
    try:
        stored = await store.load(auth, response_id)
    except RECONNECT_ERRORS as exc:
        raise GatewayError(503, "bus_unavailable", f"the response store is unreachable: {exc}") from exc
    if stored is None:
        raise _not_found(response_id, param)
    return stored


async def _history(store: StoredResponses, auth: AuthInfo, previous_id: str | None) -> list[dict[str, Any]]:
    """The conversation `previous_response_id` continues from (none without one)."""
    if previous_id is None:
        return []
    stored = await _stored(store, auth, previous_id, "previous_response_id")
    if not stored.answer_apart:
        return stored.messages
    answer = assistant_message(ResponseObject.model_validate(stored.response))
    return stored.messages + ([answer] if answer else [])


async def _within_quota(gw: Gateway, request: Request, auth: AuthInfo) -> None:
    """Refuse a request to store while its principal's stored responses are at its quota."""
    found = gw.authenticate.lookup(request.headers)
    quota = (found[1].max_stored_bytes if found else None) or MAX_STORED_BYTES
    try:
        used = await gw.responses.used(auth)
    except RECONNECT_ERRORS as exc:
        raise GatewayError(503, "bus_unavailable", f"the response store is unreachable: {exc}") from exc
    if used >= quota:
        raise GatewayError(
            429, "stored_responses_quota_exceeded",
            f"this caller's stored responses hold {used:,} bytes, at its quota of {quota:,} "
            "(max_stored_bytes in the keys file): delete some (DELETE /v1/responses/{id}), "
            "wait for them to expire, or send store: false",
            param="store",
        )


def _not_found(response_id: str, param: str) -> GatewayError:
    return GatewayError(404, "response_not_found", f"Response with id '{response_id}' not found.", param=param)


def _keeper(store: StoredResponses, auth: AuthInfo, messages: list[dict[str, Any]], *, enabled: bool) -> Keep:
    """What stores the finished response (nothing when the request said `store: false`).

    A store that fails is logged, not raised: the client still gets its answer, and a
    later `previous_response_id` naming it gets a 404."""

    async def keep(response: ResponseObject) -> None:
        if not enabled:
            return
        stored = StoredResponse(response=wire(response), messages=messages, answer_apart=True)
        try:
            await store.save(auth, response.id, stored)
        except RECONNECT_ERRORS as exc:
            log.warning("response_not_stored", completion_id=response.id, error=str(exc))

    return keep


async def _frames(gw: Gateway, relay: Relay, events: ResponseEvents, keep: Keep) -> AsyncIterator[bytes]:
    """The stream events of the run; never raises: a failure becomes `error` + `response.failed`."""
    for event in events.started():
        yield sse_event(wire(event), event.type)
    async for item in relay:
        if item.kind == "chunk" and item.chunk is not None:
            for event in events.chunk(item.chunk):
                yield sse_event(wire(event), event.type)
        elif item.kind == "progress":  # a server-side tool running: a comment clients skip
            yield sse_comment(item.progress or "")
    if relay.error is None:
        ending = events.completed()
    else:
        gw.metrics.count_error(relay.error)
        ending = events.failed(relay.error)
    await keep(events.response)
    for event in ending:
        yield sse_event(wire(event), event.type)
