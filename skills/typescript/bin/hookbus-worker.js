#!/usr/bin/env node
// The worker command: the worker's own modules first (plain JavaScript), then TypeScript
// support through tsx and `hookbus` resolved to this package, for the skills files the
// worker imports.
import { register } from 'node:module';
import { register as registerTsx } from 'tsx/esm/api';
import { main } from '../dist/worker/cli.js';

registerTsx();
register('../dist/worker/resolveHookbus.js', import.meta.url, {
  data: { url: new URL('../dist/index.js', import.meta.url).href },
});
process.exitCode = await main(process.argv.slice(2));
