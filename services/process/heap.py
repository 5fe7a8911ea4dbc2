"""The garbage collector's settings for a service process, set once it has started.

A service allocates and frees many short-lived containers per request (models, dicts of
JSON, an observation entry's stages), which CPython frees by reference counting; its
cycle collector also walks the youngest generation every 700 net allocations and, now
and then, the whole heap. After start-up that heap holds the objects of the imported
modules, classes and pydantic schemas, which never die, and walking them again and again
is most of what the collector costs. So, once a service has started (`settle`):

- the objects alive then go to the permanent generation (`gc.freeze()`), which no
  collection walks; start-up's cyclic garbage is collected first, so none is kept for good;
- the youngest generation is collected every `GEN0` net allocations instead of 700, so
  most of a request's objects are freed by reference counting before a collection sees
  them (CPython 3.13's default is 2,000 for the same reason).

Cyclic garbage still goes, later: at most what `GEN0` allocations leave behind.
"""

from __future__ import annotations

import gc

GEN0 = 10_000
"""Net allocations between two collections of the youngest generation."""


def settle() -> None:
    """Collect start-up's garbage, freeze what is left, collect the young less often.
    Once per service process, right before its event loop runs."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0, gen1, gen2)
