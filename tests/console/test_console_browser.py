"""The console in a real browser (the system's Chromium, driven by Playwright): what an
operator sees after signing in. Takes the screenshots of docs/console.md
(docs/images/console-*.png).

Skipped only where /usr/bin/chromium is missing; CI installs it (.ci/run).
"""

from __future__ import annotations

import asyncio
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Page, async_playwright, expect

from tests.console.conftest import (
    ADMIN_KEY,
    BOOM_KEY,
    FAILURE,
    HOLD_KEY,
    SECRET,
    STAGE_ORDER,
    TOOL_PROMPT,
    USER_KEY,
    Hold,
    StandaloneConsole,
    dead_letter_a_request,
    send,
)
from tests.gateway.server import RunningGateway

CHROMIUM = "/usr/bin/chromium"
SHOTS = Path(__file__).resolve().parents[2] / "docs" / "images"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
WAIT_MS = 15_000

pytestmark = pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason=f"no Chromium at {CHROMIUM}")


@pytest.fixture
async def page(tmp_path: Path) -> AsyncIterator[Page]:
    """A fresh browser profile (its own --user-data-dir) with one page."""
    async with async_playwright() as playwright:
        context = await playwright.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 860},
        )
        page = context.pages[0] if context.pages else await context.new_page()
        said: list[str] = []  # the page's own errors, printed when a test fails
        page.on("console", lambda message: said.append(f"console {message.type}: {message.text}"))
        page.on("pageerror", lambda error: said.append(f"page error: {error}"))
        try:
            yield page
        finally:
            print("\n".join(said))
            await context.close()
        # the sign-in's refused calls are expected; a script error or a CSP refusal is not
        assert not [line for line in said if "page error" in line or "Refused" in line], said


async def shoot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(SHOTS / f"console-{name}.png"), full_page=True)


async def sign_in(page: Page, url: str) -> None:
    """Open the console at `url` and sign in: a key without the admin scope is refused with
    the reason, the admin key opens the console."""
    await page.goto(url)
    await expect(page.locator("#login")).to_be_visible()
    await page.fill("#key", USER_KEY)
    await page.click("#login button[type=submit]")
    await expect(page.locator("#login-why")).to_contain_text("hookbus:admin")
    await page.fill("#key", ADMIN_KEY)
    await page.click("#login button[type=submit]")


async def test_an_operator_sees_groups_waterfalls_a_failed_hook_and_requeues_a_dead_letter(
    page: Page, gateway: RunningGateway, stack: Any, hold: Hold
) -> None:
    expect.set_options(timeout=WAIT_MS)
    completion_id, status = await send(gateway, USER_KEY, TOOL_PROMPT)
    assert status == 200 and completion_id
    for text in ("hello", "what is 2 + 3?"):
        assert (await send(gateway, USER_KEY, text))[1] == 200
    assert (await send(gateway, BOOM_KEY, "hello"))[1] == 503
    dead_id = await dead_letter_a_request(stack)

    await sign_in(page, f"{gateway.url}/console/")

    # the key stays in the tab: no cookie holds it
    await expect(page.locator("#sign-out")).to_be_visible()
    assert await page.context.cookies() == []
    assert await page.evaluate("sessionStorage.getItem('hookbus-console-key')") == ADMIN_KEY

    # Bus: the group with its two replicas, live
    group = page.locator("section[data-group=audit]")
    await expect(group.locator("tr[data-replica]")).to_have_count(2)
    await expect(group.locator("tr[data-replica=audit-0]")).to_contain_text("audit-0")
    await expect(group.locator("tr[data-replica=audit-1]")).to_contain_text("audit-1")
    await expect(group).to_contain_text("2 live")
    up_for = group.locator("tr[data-replica=audit-0] td.up-for")
    await expect(up_for).to_have_text(re.compile(r"^\d+ (s|min)$"))  # as the replica says, not "≥ seen for"
    await expect(page.locator("[data-testid=orchestrators]")).to_contain_text("orch-0")
    await expect(page.locator("#live")).to_contain_text("live")
    await shoot(page, "bus")

    # Requests: one still running (held by a hook) with its model and caller; the failed one
    # with its status; filtering by caller keeps it alone
    held = asyncio.create_task(send(gateway, HOLD_KEY, "hello"))
    await page.click("nav a[data-view=requests]")
    rows = page.locator("[data-testid=requests] tr[data-completion-id]")
    running = rows.filter(has_text="carol")
    try:
        await expect(running.locator("td.status")).to_have_text("running")
        await expect(running).to_contain_text("offline")
        await expect(rows.filter(has_text="503")).to_have_count(1)
        await expect(page.locator(f"tr[data-completion-id='{completion_id}']")).to_contain_text("alice")
        await shoot(page, "requests")
    finally:
        hold.release.set()
    assert (await held)[1] == 200
    await expect(running.locator("td.status")).to_have_text("200 ok")
    await page.fill("[data-filter=caller]", "bob")
    await expect(rows).to_have_count(1)
    await expect(rows.first).to_contain_text("503")

    # the failed request's waterfall: the hook's error, and finalize_connection still ran
    await rows.first.click()
    await expect(page.locator("[data-testid=request-status]")).to_contain_text("503")
    failed = page.locator(".step[data-lifecycle=before_llm_call][data-outcome=aborted], .step[data-lifecycle=before_llm_call][data-outcome=failed]")
    await expect(failed.first.locator(".step-error")).to_have_text(FAILURE)
    await expect(page.locator(".step[data-kind=stage][data-lifecycle=finalize_connection]")).to_have_count(1)
    await shoot(page, "waterfall-failed")

    # a successful request's waterfall (opened by its link): every stage in order, with hops
    await page.goto(f"{gateway.url}/console/#/requests/{completion_id}")
    stages = page.locator("[data-testid=waterfall] .step[data-kind=stage], [data-testid=waterfall] .step[data-kind=llm], [data-testid=waterfall] .step[data-kind=tool]")
    await expect(stages).to_have_count(len(STAGE_ORDER))
    assert await stages.evaluate_all("steps => steps.map(s => s.dataset.lifecycle)") == STAGE_ORDER
    widths = await page.locator(".step[data-kind=llm] .bar, .step[data-kind=stage] .bar").evaluate_all(
        "bars => bars.map(b => b.getBoundingClientRect().width)"
    )
    track = await page.locator(".step .track").first.evaluate("t => t.getBoundingClientRect().width")
    assert 0 < sum(widths) <= track * 1.01 and max(widths) > track / 20  # bars drawn to the time axis
    hops = page.locator("[data-testid=waterfall] .step[data-kind=hop]")
    await expect(hops.first).to_contain_text("audit")
    await expect(page.locator("[data-testid=request-status]")).to_contain_text("200")
    await shoot(page, "waterfall")

    # Dead letters: the content is hidden until asked; requeue sends it back
    await page.click("nav a[data-view=dead-letters]")
    letter_row = page.locator("[data-testid=dead-letters] tr[data-letter-id]", has_text=dead_id)
    await expect(letter_row).to_have_count(1)
    letter_id = await letter_row.get_attribute("data-letter-id")
    await letter_row.click()
    payload = page.locator("[data-testid=payload]")
    await expect(payload).to_contain_text(dead_id)
    await expect(payload).not_to_contain_text(SECRET)
    await expect(payload).to_contain_text("hidden")
    await shoot(page, "dead-letters")
    await page.click("button[data-action=content]")
    await expect(payload).to_contain_text(SECRET)
    await page.click("button[data-action=requeue]")
    await expect(page.locator("[data-testid=notice]")).to_contain_text("Requeued onto")
    await expect(page.locator(f"tr[data-letter-id='{letter_id}']")).to_have_count(0)
    client = stack[0]
    requeued = await client.redis.xrange(client.keys.dead_letter, min=letter_id, max=letter_id)
    assert requeued == []


async def test_hookbus_console_signs_in_and_refuses_like_the_gateway(
    page: Page, standalone: StandaloneConsole, stack: Any
) -> None:
    """`hookbus console --api-keys FILE`: the same sign-in, refusals and views as `/console/`."""
    expect.set_options(timeout=WAIT_MS)
    await sign_in(page, f"{standalone.url}/")  # the root sends to the console
    await expect(page.locator("#sign-out")).to_be_visible()
    group = page.locator("section[data-group=audit]")
    await expect(group.locator("tr[data-replica]")).to_have_count(2)
    await expect(page.locator("#live")).to_contain_text("live")

    # an unknown request is said to be unknown (a 404), not a failure of the console
    await page.goto(f"{standalone.url}/console/#/requests/chatcmpl-nobody")
    await expect(page.locator(".error-box")).to_contain_text("chatcmpl-nobody")

    # signing out forgets the key: the sign-in form again
    await page.click("#sign-out")
    await expect(page.locator("#login")).to_be_visible()
    assert await page.evaluate("sessionStorage.getItem('hookbus-console-key')") is None
