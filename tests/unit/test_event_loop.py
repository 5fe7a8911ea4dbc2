"""The services' event loop: uvloop unless HOOKBUS_EVENT_LOOP=asyncio; a typo is refused."""

from __future__ import annotations

import asyncio

import pytest
import uvloop
from pydantic import ValidationError

from hookbus.services.process import event_loop

VARIABLE = "HOOKBUS_EVENT_LOOP"


async def loop_type() -> type:
    return type(asyncio.get_running_loop())


def test_services_run_on_uvloop_by_default(monkeypatch):
    monkeypatch.delenv(VARIABLE, raising=False)
    assert event_loop.run(loop_type()) is uvloop.Loop


def test_the_stock_loop_when_asked_for(monkeypatch):
    monkeypatch.setenv(VARIABLE, "asyncio")
    assert not issubclass(event_loop.run(loop_type()), uvloop.Loop)


def test_an_unknown_loop_name_is_refused(monkeypatch):
    monkeypatch.setenv(VARIABLE, "tokio")
    with pytest.raises(ValidationError, match="'uvloop' or 'asyncio'"):
        event_loop.loop_factory()
