/**
 * hookbus for TypeScript: write hooks as skills, run them as a hookbus worker group
 * (`npx hookbus-worker --group NAME ./skills.ts`) beside Python groups, in one priority order.
 */

export { Skill, type Compaction, type BoundHook, type BoundTool } from './skill.js';
export { hook, tool, type HookOptions, type ToolOptions } from './decorators.js';
export type { HookData, Message, ToolCall, ChatCompletionChunk, Usage } from './data.js';
export { Context, type AuthInfo, type Metadata, type Session, type HookCall } from './context.js';
export { HookError, PaymentRequired, isHookError, type HookErrorDict } from './errors.js';
export { LIFECYCLES, WRITABLE, type Lifecycle } from './lifecycle.js';
export type { HookDescriptor, ToolDescriptor } from './descriptors.js';
export { PROTOCOL } from './wire/envelopes.js';
