// Writes src/generated/protocol.ts from the protocol spec that `hookbus protocol` generates
// (services/protocol/spec/protocol.json in the repository, or the file HOOKBUS_PROTOCOL_SPEC
// names): the protocol version and the constants every worker shares (timings, size limits,
// the version rule, key names). Run by `npm run build` and `npm test` before tsc, so the
// TypeScript worker never restates them.
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const spec = resolve(process.env.HOOKBUS_PROTOCOL_SPEC ?? resolve(here, '../../../services/protocol/spec/protocol.json'));
const index = JSON.parse(readFileSync(spec, 'utf8'));
if (typeof index.protocol !== 'string' || !index.constants) {
  throw new Error(`${spec}: no protocol version or constants: regenerate it with \`hookbus protocol\``);
}
const out = resolve(here, '../src/generated/protocol.ts');
const body = `// Generated from ${relative(resolve(here, '..'), spec)} by scripts/protocol.mjs: do not edit.
/** The protocol version this worker speaks, announced with its group (docs/protocol.md). */
export const PROTOCOL = ${JSON.stringify(index.protocol)};
/** The constants every worker shares (the spec's \`constants\`: docs/protocol.md). */
export const CONSTANTS = ${JSON.stringify(index.constants, null, 2)} as const;
`;
mkdirSync(dirname(out), { recursive: true });
writeFileSync(out, body);
