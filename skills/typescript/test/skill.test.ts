// The SDK a skill author touches: decorators (both forms), Skill binding, HookData's guard.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Skill, hook, tool, HookError, PaymentRequired, LIFECYCLES } from '../src/index.ts';
import { guarded } from '../src/data.ts';
import { classesIn, exportLine, parseSpec } from '../src/worker/loadSkills.ts';
import { Keys } from '../src/bus/keys.ts';

test('an unknown lifecycle fails when the class is defined', () => {
  assert.throws(() => {
    class Bad extends Skill {
      @hook({ lifecycle: 'on_chunks' as 'on_chunk' })
      async f(data: unknown) {
        return data;
      }
    }
    return Bad;
  }, /unknown lifecycle "on_chunks"; valid lifecycles are: on_connection/);
  assert.throws(() => hook({ lifecycle: 'on_chunk', timeout: 0 }), /timeout must be positive/);
  assert.throws(() => hook({ lifecycle: 'finalize_connection', guard: true }), /cannot be a guard/);
  assert.throws(() => hook({ lifecycle: 'on_compaction', guard: true }), /cannot be a guard/);
  assert.equal(LIFECYCLES.length, 9);
});

test('observe and holdBack follow the rules of the Python decorator', () => {
  assert.throws(() => hook({ lifecycle: 'on_message', observe: true, guard: true }), /observer \(observe: true\) cannot be a guard or critical/);
  assert.throws(() => hook({ lifecycle: 'on_message', observe: true, critical: true }), /cannot be a guard or critical/);
  assert.throws(() => hook({ lifecycle: 'on_message', holdBack: 10 }), /only on_chunk hooks take it, not on_message/);
  assert.throws(() => hook({ lifecycle: 'on_chunk', holdBack: -1 }), /holdBack must be an integer >= 0/);
  assert.throws(() => hook({ lifecycle: 'on_chunk', holdBack: 5, observe: true }), /not an observer/);
  class Watch extends Skill {
    @hook({ lifecycle: 'finalize_connection', priority: 90, observe: true })
    async watch() {}

    @hook({ lifecycle: 'on_chunk', priority: 20, holdBack: 24 })
    async judge() {}
  }
  assert.deepEqual(new Watch().boundHooks().map((h) => [h.key, h.descriptor.observe, h.descriptor.hold_back]), [
    ['watch.watch', true, 0],
    ['watch.judge', false, 24],
  ]);
});

class Base extends Skill {
  @hook({ lifecycle: 'on_message', priority: 7 })
  async inherited(data: unknown) {
    return data;
  }
}

class AuditTrail extends Base {
  @hook({ lifecycle: 'on_chunk', priority: 30, scope: 'audit', timeout: 2, critical: true })
  async second(data: unknown) {
    return data;
  }

  @hook('before_toolcall')
  async third(data: unknown) {
    return data;
  }

  @tool({ description: 'Add two numbers.', parameters: { type: 'object', properties: { a: { type: 'number' }, b: { type: 'number' } }, required: ['a', 'b'] } })
  async add(args: { a: number; b: number }) {
    return args.a + args.b;
  }

  async onCompaction() {}
}

test('a skill binds its hooks inherited first, in definition order, with Python descriptors', () => {
  const skill = new AuditTrail();
  assert.equal(skill.name, 'audit-trail'); // the class name in kebab case, as in Python
  assert.deepEqual(
    skill.boundHooks().map((h) => h.descriptor),
    [
      { skill: 'audit-trail', method: 'inherited', lifecycle: 'on_message', priority: 7, scope: 'all', timeout: null, critical: false, guard: false, observe: false, hold_back: 0 },
      { skill: 'audit-trail', method: 'second', lifecycle: 'on_chunk', priority: 30, scope: 'audit', timeout: 2, critical: true, guard: false, observe: false, hold_back: 0 },
      { skill: 'audit-trail', method: 'third', lifecycle: 'before_toolcall', priority: 50, scope: 'all', timeout: null, critical: false, guard: false, observe: false, hold_back: 0 },
      // the method form: a hook on on_compaction, as Python's `on_compaction` method
      { skill: 'audit-trail', method: 'onCompaction', lifecycle: 'on_compaction', priority: 50, scope: 'all', timeout: null, critical: false, guard: false, observe: false, hold_back: 0 },
    ],
  );
  const [add] = skill.boundTools();
  assert.deepEqual(add!.descriptor.parameters_schema, {
    type: 'function',
    function: { name: 'add', description: 'Add two numbers.', parameters: { type: 'object', properties: { a: { type: 'number' }, b: { type: 'number' } }, required: ['a', 'b'] } },
  });
  assert.deepEqual(new Base().boundHooks().map((h) => h.key), ['base.inherited']);
});

test('the legacy experimentalDecorators form marks the method too', () => {
  class Legacy extends Skill {
    readonly name = 'legacy';
    async f(data: unknown) {
      return data;
    }
  }
  const descriptor = Object.getOwnPropertyDescriptor(Legacy.prototype, 'f')!;
  const decorate = hook({ lifecycle: 'on_chunk', priority: 3 }) as unknown as (t: object, k: string, d: PropertyDescriptor) => PropertyDescriptor;
  Object.defineProperty(Legacy.prototype, 'f', decorate(Legacy.prototype, 'f', descriptor));
  assert.deepEqual(new Legacy().boundHooks().map((h) => [h.key, h.descriptor.priority]), [['legacy.f', 3]]);
});

test('HookData refuses a field that is read-only at its lifecycle, naming the writable ones', () => {
  const data = guarded({ lifecycle: 'after_toolcall', tool_result: 'x', tool_id: 'c1' });
  data.tool_result = 'changed';
  assert.throws(() => {
    (data as { tool_id: string }).tool_id = 'other';
  }, /HookData.tool_id is read-only at after_toolcall; a hook may change: tool_result/);
  assert.throws(() => {
    (data as unknown as Record<string, unknown>).bogus = 1;
  }, /HookData has no field bogus/);
});

test('HookError and PaymentRequired travel as the Python classes', () => {
  assert.deepEqual(new PaymentRequired('no credit', { balance: 0 }).toDict(), {
    type: 'PaymentRequired', status_code: 402, code: 'payment_required', message: 'no credit', details: { balance: 0 },
  });
  class Teapot extends HookError {}
  assert.equal(new Teapot(418, 'teapot', 'short and stout').toDict().type, 'HookError');
});

test('the worker finds classes a file defines without exporting them, safely', () => {
  const source = 'import { Skill } from "hookbus";\nclass A extends Skill {}\nexport class B extends Skill {}\nfunction f() {\n  class C {}\n}\n';
  assert.deepEqual(classesIn(source), { all: ['A', 'B', 'C'], hidden: ['A', 'C'] });
  assert.match(exportLine(['A', 'C']), /typeof C === 'undefined' \? undefined : C/);
  assert.deepEqual(parseSpec('./skills.ts:Billing'), { path: './skills.ts', className: 'Billing' });
  assert.deepEqual(parseSpec('./skills.ts'), { path: './skills.ts' });
});

test("sharded key names are the Python Keys' (values printed by hookbus.bus.keys.Keys)", () => {
  const keys = new Keys('hookbus:', 5);
  assert.deepEqual(keys.hookStreams('g'), ['hookbus:hooks:{s0.10}:g', 'hookbus:hooks:{s1.2}:g', 'hookbus:hooks:{s2.0}:g', 'hookbus:hooks:{s3.3}:g', 'hookbus:hooks:{s4.2}:g']);
  assert.equal(keys.replicas('g'), 'hookbus:{registry}:replicas:g');
  assert.equal(keys.registry, 'hookbus:{registry}:registry');
  assert.equal(keys.eventsFor('chatcmpl-abc'), 'hookbus:events:{s1.2}');
  assert.deepEqual(new Keys('p:').hookStreams('g'), ['p:hooks:g']);
  assert.equal(new Keys('p:').replicas('g'), 'p:replicas:g');
});
