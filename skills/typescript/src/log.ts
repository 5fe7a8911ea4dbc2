/** The worker's and the runner's log lines: one JSON object per line on stderr, as the Python services write
 * them (structlog JSON), so one log pipeline reads both. HOOKBUS_LOG_LEVEL=warning hides info. */

const LEVELS: Record<string, number> = { debug: 10, info: 20, warning: 30, error: 40 };

export function log(event: string, fields: Record<string, unknown> = {}, level = 'warning', logger = 'hookbus.worker'): void {
  const threshold = LEVELS[(process.env.HOOKBUS_LOG_LEVEL ?? 'info').toLowerCase()] ?? 20;
  if ((LEVELS[level] ?? 30) < threshold) return;
  process.stderr.write(JSON.stringify({ event, level, logger, timestamp: new Date().toISOString(), ...fields }) + '\n');
}
